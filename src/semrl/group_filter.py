"""DAPO's dynamic sampling: keep the prompt groups whose rewards differ (docs/algorithms.md, "DAPO")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from semrl.batch import RolloutBatch, gather_groups
from semrl.metrics import reward_metrics

if TYPE_CHECKING:
    from semrl.config import AlgorithmConfig
    from semrl.distributed import ProcessGroup

logger = logging.getLogger(__name__)

GroupRef = tuple[RolloutBatch, int]  # (batch, group index in it)


def split_groups(
    batch: RolloutBatch, metric: Literal["reward", "accuracy"]
) -> tuple[list[GroupRef], list[GroupRef]]:
    """(kept, dropped) groups of ``batch``, in batch order."""
    informative = batch.informative_groups(metric)
    kept = [(batch, g) for g in range(batch.num_groups) if informative[g]]
    dropped = [(batch, g) for g in range(batch.num_groups) if not informative[g]]
    return kept, dropped


def choose_groups(kept: list[GroupRef], dropped: list[GroupRef], wanted: int) -> list[GroupRef]:
    """The first ``wanted`` kept groups, filled up with dropped ones (whose advantages are zero)."""
    return (kept + dropped)[:wanted]


def collect_groups(
    scored_round: Callable[[int], tuple[RolloutBatch, float]], wanted: int, algo: AlgorithmConfig,
    procs: ProcessGroup,
) -> tuple[RolloutBatch, dict[str, float], float]:
    """The step's batch of ``wanted`` groups from rounds of ``scored_round(round) -> (rolled-out and
    rewarded batch, seconds spent rewarding)``.

    Without ``algorithm.dynamic_sampling`` that is one round. With it (DAPO), groups whose rewards
    are all equal are dropped and more rounds run until ``wanted`` groups remain, for at most
    ``algorithm.max_sampling_rounds``; a batch still short is filled with dropped groups, whose
    advantages are zero. With several processes each one keeps its share of the groups, and all of
    them sample until every share is full. Returns (batch, reward metrics over every sampled
    sequence, seconds spent rewarding).
    """
    sampled: list[RolloutBatch] = []
    kept: list[GroupRef] = []
    dropped: list[GroupRef] = []
    reward_seconds = 0.0
    while True:
        batch, seconds = scored_round(len(sampled))
        reward_seconds += seconds
        sampled.append(batch)
        if not algo.dynamic_sampling:
            return batch, reward_metrics(sampled), reward_seconds
        more_kept, more_dropped = split_groups(batch, algo.dynamic_sampling_metric)
        kept, dropped = kept + more_kept, dropped + more_dropped
        if procs.all_true(len(kept) >= wanted) or len(sampled) >= algo.max_sampling_rounds:
            break
    if len(kept) < wanted:
        logger.warning(
            "dynamic sampling: %d of %d groups have distinct rewards after %d rollout batches "
            "(algorithm.max_sampling_rounds); filling with zero-advantage groups", len(kept), wanted,
            len(sampled),
        )
    metrics = reward_metrics(sampled)
    metrics["dynamic_sampling/rollout_batches"] = float(len(sampled))
    metrics["dynamic_sampling/kept_groups"] = procs.sum(min(len(kept), wanted))
    metrics["dynamic_sampling/filled_groups"] = procs.sum(max(0, wanted - len(kept)))
    return gather_groups(choose_groups(kept, dropped, wanted)), metrics, reward_seconds
