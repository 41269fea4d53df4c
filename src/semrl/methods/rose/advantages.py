"""ROSE segment advantages over one prompt's prefix tree, as pure functions.

Definitions: docs/algorithms.md, "ROSE: nodes and segment advantages" (ROSE paper eqs. 4-7) and
"ROSE: length-aware calibration" (eq. 8). The tree type and its nodes are ``semrl.rollout.tree``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from semrl.rollout.tree import ChainTree, code_compat_node_sets, exact_node_points, segments_between


def segment_advantages(
    tree: ChainTree,
    rewards: torch.Tensor,
    width: int,
    *,
    alpha: float = 1.0,
    code_compat: bool = False,
    correct: torch.Tensor | None = None,
    correct_eps: float = 1e-6,
) -> torch.Tensor:
    """ROSE advantages of one group: (G,) rewards -> (G, width) per-token advantages.

    Segment [b_j, b_{j+1}) of chain c gets V(b_{j+1}) - V(b_j), the last segment r_c - V(b_last);
    V(node) = mean reward of the chains through it and V(root) = mean of the group, so a chain's
    segment values telescope to r_c - mean(r) (the Dr.GRPO advantage). Then, if ``alpha > 0``,
    eq. 8: for every correct chain longer than the shortest correct one o_s, tokens after their
    divergence point k get ``A <- A - |A| * (1 - ((L_s - k) / (L_c - k)) ** alpha)``.
    Padding (t >= L_c) is 0.

    ``correct``: (G,) bool, the verified correctness of each chain, which decides who is "correct"
    in eq. 8. Without it, a chain counts as correct when ``|r| > correct_eps`` (the ROSE code's
    rule, which misreads shaped or negative rewards as correct).
    """
    g = len(tree)
    rewards = rewards.float()
    if rewards.shape != (g,):
        raise ValueError(f"rewards must have shape ({g},), got {tuple(rewards.shape)}")
    nodes = _code_compat_nodes(tree, rewards) if code_compat else _exact_nodes(tree, rewards)
    adv = torch.zeros(g, width)
    for c in range(g):
        for start, end in segments_between(nodes.chain_points[c], tree.lengths[c]):
            end_value = rewards[c].item() if end == tree.lengths[c] else nodes.value(c, end)
            adv[c, start:end] = end_value - nodes.value(c, start)
    if alpha > 0:
        is_correct = rewards.abs() > correct_eps if correct is None else correct.bool()
        correct_chains = [c for c in range(g) if bool(is_correct[c])]
        if len(correct_chains) >= 2:
            shortest = min(correct_chains, key=lambda c: (tree.lengths[c], c))
            for c in correct_chains:
                if c != shortest:
                    k = nodes.divergence_point(shortest, c)
                    adv[c] = length_discount(adv[c], tree.lengths[c], tree.lengths[shortest], k, alpha)
    return adv


@dataclass(frozen=True)
class _Nodes:
    """A group's nodes as the segment advantages read them.

    Attributes:
        chain_points: per chain, its branch positions (the root's 0 left out).
        value: (chain, position) -> the value of the chain's node at that position.
        divergence_point: (chain a, chain b) -> the position where the two part.
    """

    chain_points: list[list[int]]
    value: Callable[[int, int], float]
    divergence_point: Callable[[int, int], int]


def _exact_nodes(tree: ChainTree, rewards: torch.Tensor) -> _Nodes:
    """Nodes by the exact tree: a position together with the chains sharing the prefix up to it."""
    points, nodes = exact_node_points(tree)
    root_value = rewards.mean().item()
    # unique per (chain, position): shared-prefix lengths form an ultrametric
    member_of = {(c, k): members for (k, members) in nodes for c in members}

    def value(c: int, k: int) -> float:
        return root_value if k == 0 else rewards[sorted(member_of[(c, k)])].mean().item()

    return _Nodes(points, value, tree.shared_prefix)


def _code_compat_nodes(tree: ChainTree, rewards: torch.Tensor) -> _Nodes:
    """Nodes keyed by (prompt, position), as ROSE's code keys them (``rose.code_compat``)."""
    sets = code_compat_node_sets(tree)
    g, lengths = len(tree), tree.lengths
    points = sorted(set().union(*sets))
    values = {k: rewards[[b for b in range(g) if k in sets[b]]].mean().item() for k in points}
    values[0] = rewards.mean().item()

    def divergence_point(a: int, b: int) -> int:  # deepest common position in both sets
        common = [k for k in sets[a] & sets[b] if k <= min(lengths[a], lengths[b])]
        return max(common) if common else 0

    return _Nodes([sorted(k for k in s if k != 0) for s in sets], lambda c, k: values[k], divergence_point)


def length_discount(
    adv: torch.Tensor, length: int, shortest: int, diverge: int, alpha: float
) -> torch.Tensor:
    """Eq. 8 on one chain: (width,) -> (width,). Tokens in [diverge, length) get
    ``A - |A| * (1 - ((shortest - diverge) / (length - diverge)) ** alpha)`` when that factor > 0."""
    if length <= diverge:
        return adv
    factor = 1.0 - ((shortest - diverge) / (length - diverge)) ** alpha
    if factor <= 0:
        return adv
    out = adv.clone()
    out[diverge:length] = adv[diverge:length] - adv[diverge:length].abs() * factor
    return out
