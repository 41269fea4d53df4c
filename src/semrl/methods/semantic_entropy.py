"""Semantic entropy over answer clusters (SENT section 2.1, SEED-GRPO section 5), pure functions.

Responses with equivalent final answers form a cluster; a response without an answer is a cluster
of its own. The cluster mass is the sum of its responses' likelihoods, either
exp(mean token log-prob) (``length_normalized``: avoids underflow and length bias) or a count
(``frequency``: |C_k| / M). H = -sum_k p_k log p_k over normalised masses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch

from semrl.reward.extract import normalize_answer

Estimator = Literal["length_normalized", "frequency"]


def cluster_answers(
    answers: Sequence[str | None], equivalent: Callable[[str, str], bool] | None = None
) -> list[int]:
    """Cluster id per answer. ``equivalent(a, b)`` decides equivalence against each cluster's first
    member (default: equal normalised strings, SEED-GRPO's code); ``None`` answers are singletons."""
    ids: list[int] = []
    representatives: list[str] = []
    by_string: dict[str, int] = {}
    for answer in answers:
        if answer is None:
            ids.append(len(representatives))
            representatives.append("\0none")  # never equal to anything
            continue
        key = normalize_answer(answer)
        if key in by_string:
            ids.append(by_string[key])
            continue
        found = -1
        if equivalent is not None:
            found = next(
                (c for c, rep in enumerate(representatives) if rep != "\0none" and equivalent(rep, answer)),
                -1,
            )
        if found < 0:
            found = len(representatives)
            representatives.append(answer)
        by_string[key] = found
        ids.append(found)
    return ids


def cluster_entropy(
    cluster_ids: Sequence[int],
    mean_logprobs: torch.Tensor | None = None,
    estimator: Estimator = "length_normalized",
) -> float:
    """Semantic entropy (nats) of M responses given their cluster ids.

    Args:
        cluster_ids: (M,) cluster of each response.
        mean_logprobs: (M,) mean token log-prob of each response (``length_normalized``).
    """
    m = len(cluster_ids)
    if m == 0:
        raise ValueError("semantic entropy of zero responses")
    if estimator == "frequency":
        weights = torch.ones(m, dtype=torch.float64)
    elif estimator == "length_normalized":
        if mean_logprobs is None or len(mean_logprobs) != m:
            raise ValueError("length_normalized semantic entropy needs one mean log-prob per response")
        weights = mean_logprobs.double().exp()
    else:
        raise ValueError(f"unknown semantic entropy estimator '{estimator}'")
    ids = torch.tensor(list(cluster_ids))
    mass = torch.zeros(int(ids.max()) + 1, dtype=torch.float64).index_add_(0, ids, weights)
    p = mass[mass > 0] / mass.sum()
    return float(-(p * p.log()).sum())


def max_entropy(num_responses: int) -> float:
    """log M: every response in its own cluster with equal mass."""
    return math.log(num_responses)
