"""TreePO's pure functions (arXiv 2508.17445; docs/algorithms.md "TreePO"): the tree advantage,
batch whitening, the branching budget, the fallback cut and the repetition test.

A TreePO leaf is identified by its **path**: the ids of the segment nodes it passes through, root
excluded (``path[j]`` is the node of its segment j + 1). Ids are unique within a prompt's tree and
assigned when a segment is sampled, so two leaves share their first j ids iff they share their first
j segments by construction (the official code's ``tree_idx``, docs/methods/treepo.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import torch

TreeWeight = Literal["average", "group_size"]


def tree_outcome_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[int],
    paths: Sequence[Sequence[int]],
    weight: TreeWeight = "average",
    drop_zero_std_subgroups: bool = False,
) -> torch.Tensor:
    """TreePO's per-leaf advantage before whitening (paper eq. 5-7, the official estimator
    ``tree_reinforce_plus_plus_baseline``).

    With D the largest path length in the batch, leaf i has one term per depth level j = 0 .. D - 1:
    ``R_i - mean(R_k : k in G_j(i))``, G_j(i) the leaves of i's prompt whose first j path ids equal
    i's. Level 0 (the prompt's group) always counts; a level j >= 1 counts only when |G_j(i)| > 1
    (and, with ``drop_zero_std_subgroups``, eq. 7, when its rewards are not all equal). Levels are
    counted, not distinct sets: a node with one child gives the same group at two depths, counted
    twice. The terms are averaged (``average``, eq. 5) or weighted by |G_j| (``group_size``, eq. 6).
    A prompt group of one leaf has mean 0 at level 0 (the code's choice), so its term is R_i.

    Args:
        rewards: (N,) reward of each leaf.
        group_ids: (N,) the prompt of each leaf.
        paths: (N,) node ids of each leaf's segments, each of length >= 1.

    Returns:
        (N,) float32 advantages, not yet whitened (``whiten``).
    """
    n = len(paths)
    if rewards.shape != (n,) or len(group_ids) != n:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, group_ids ({len(group_ids)}) and paths ({n}) differ"
        )
    if any(len(p) == 0 for p in paths):
        raise ValueError("every TreePO leaf has at least one segment: an empty path")
    values = rewards.double().tolist()
    depth = max((len(p) for p in paths), default=0)
    terms: list[list[tuple[float, int]]] = [[] for _ in range(n)]  # (R_i - mean, |G_j|) per counted level
    for j in range(depth):
        members: dict[tuple[int, tuple[int, ...]], list[int]] = defaultdict(list)
        keys = [(int(group_ids[i]), tuple(paths[i][:j])) for i in range(n)]
        for i, key in enumerate(keys):
            members[key].append(i)
        for i, key in enumerate(keys):
            group = [values[k] for k in members[key]]
            size = len(group)
            if j > 0 and (size < 2 or (drop_zero_std_subgroups and max(group) == min(group))):
                continue
            mean = sum(group) / size if size > 1 else 0.0
            terms[i].append((values[i] - mean, size))
    out = torch.empty(n, dtype=torch.float64)
    for i, leaf_terms in enumerate(terms):
        if weight == "average":
            out[i] = sum(t for t, _ in leaf_terms) / len(leaf_terms)
        elif weight == "group_size":
            out[i] = sum(t * s for t, s in leaf_terms) / sum(s for _, s in leaf_terms)
        else:
            raise ValueError(f"unknown TreePO weight '{weight}'; use average or group_size")
    return out.float()


def whiten(
    values: torch.Tensor, mask: torch.Tensor, subtract_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Batch-wide token-weighted whitening (REINFORCE++'s, the TreePO code's ``masked_whiten``).

    ``(x - mu) / sqrt(var + eps)`` with mu and var the mean and the unbiased (Bessel) variance over
    every position where ``mask`` is 1; ``subtract_mean=False``: ``x / sqrt(var + eps)`` (TreePO
    paper eq. 5, which divides by the std only). A batch of one token has variance 0.

    Args:
        values: (N, T) per-token values.
        mask: (N, T) 1 on response tokens.

    Returns:
        (N, T) whitened values, 0 where ``mask`` is 0.
    """
    mask = mask.to(values.dtype)
    count = mask.sum()
    if count == 0:
        return values * mask
    mean = (values * mask).sum() / count
    var = (((values - mean) ** 2) * mask).sum() / count
    if count > 1:
        var = var * count / (count - 1)
    shifted = values - mean if subtract_mean else values
    return shifted * torch.rsqrt(var + eps) * mask


def branch_budget(width: int, finished: int, finished_now: int, active: int, branch: int) -> list[int]:
    """Copies of each of a prompt's ``active`` paths for the next segment (the code's
    ``by_response_traj`` + ``by_fixed_div`` + ``fixed_avg``).

    Each leaf finished this step donates its ``branch`` budget to the survivors (budget transfer):
    ``total = max(min(width - finished, branch * (finished_now + active)), active)``, spread evenly,
    the remainder to the last path, at least one copy each. ``finished`` counts this step's leaves
    too. Since ``active + finished <= width`` before the call, the copies plus ``finished`` stay <= width.
    """
    if active < 1:
        raise ValueError("branch_budget needs at least one active path")
    remaining = max(width - finished, 0)
    total = max(min(remaining, branch * (finished_now + active)), active)
    each, rest = divmod(total, active)
    return [max(1, each)] * (active - 1) + [max(1, each + rest)]


def has_repetition(text: str, window: int = 32, min_count: int = 8) -> bool:
    """Whether some ``window``-character substring occurs at least ``min_count`` times in ``text``,
    overlapping occurrences counted (TreePO's early stop on a repeating segment)."""
    counts: dict[str, int] = defaultdict(int)
    for start in range(len(text) - window + 1):
        piece = text[start : start + window]
        counts[piece] += 1
        if counts[piece] >= min_count:
            return True
    return False
