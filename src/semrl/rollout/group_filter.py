"""DAPO's dynamic sampling: keep the prompt groups whose rewards differ (docs/algorithms.md, "DAPO").

The trainer runs the rounds and hands each scored batch to a ``GroupFilter``; the filter never calls
back into the trainer::

    groups = GroupFilter(wanted, cfg.algorithm, processes)
    while not groups.full:
        batch = rollout(); groups.add(batch, reward(batch))
    batch, scores, metrics = groups.result()  # metrics: the filter's own (dynamic_sampling/*)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from semrl.reward import Scores
from semrl.rollout.batch import RolloutBatch, gather_groups

if TYPE_CHECKING:
    from semrl.config.sections import AlgorithmConfig
    from semrl.core.distributed import ProcessGroup

logger = logging.getLogger(__name__)

GroupRef = tuple[RolloutBatch, Scores, int]  # (batch, its scores, group index in it)


def split_groups(
    batch: RolloutBatch, scores: Scores, metric: Literal["reward", "accuracy"]
) -> tuple[list[GroupRef], list[GroupRef]]:
    """(kept, dropped) groups of ``batch``, in batch order."""
    informative = scores.informative_groups(batch.group_size, metric)
    kept = [(batch, scores, g) for g in range(batch.num_groups) if informative[g]]
    dropped = [(batch, scores, g) for g in range(batch.num_groups) if not informative[g]]
    return kept, dropped


def choose_groups(kept: list[GroupRef], dropped: list[GroupRef], wanted: int) -> list[GroupRef]:
    """The first ``wanted`` kept groups, filled up with dropped ones (whose advantages are zero)."""
    return (kept + dropped)[:wanted]


class GroupFilter:
    """The step's batch of ``wanted`` groups from the scored batches of one or more rollout rounds.

    Without ``algorithm.dynamic_sampling`` one round fills it. With it (DAPO), groups whose rewards
    are all equal are dropped and more rounds run until ``wanted`` groups remain, for at most
    ``algorithm.max_sampling_rounds``; a batch still short is filled with dropped groups, whose
    advantages are zero. With several processes each one keeps its share of the groups, and all of
    them sample until every share is full (``full`` agrees across processes).
    """

    def __init__(self, wanted: int, algo: AlgorithmConfig, processes: ProcessGroup) -> None:
        self.wanted, self.algo, self.processes = wanted, algo, processes
        self.sampled: list[tuple[RolloutBatch, Scores]] = []
        self.kept: list[GroupRef] = []
        self.dropped: list[GroupRef] = []
        self.full = False

    @property
    def rounds(self) -> int:
        """Rollout rounds added so far (the next round's index)."""
        return len(self.sampled)

    def add(self, batch: RolloutBatch, scores: Scores) -> None:
        """One round's batch and its scores."""
        self.sampled.append((batch, scores))
        if not self.algo.dynamic_sampling:
            self.full = True
            return
        kept, dropped = split_groups(batch, scores, self.algo.dynamic_sampling_metric)
        self.kept += kept
        self.dropped += dropped
        enough = self.processes.all_true(len(self.kept) >= self.wanted)
        self.full = enough or self.rounds >= self.algo.max_sampling_rounds

    def result(self) -> tuple[RolloutBatch, Scores, dict[str, float]]:
        """The step's batch, its scores, and the filter's metrics (``dynamic_sampling/*``, none without
        dynamic sampling). The reward metrics over every sampled sequence read ``sampled``."""
        assert self.full, "the filter wants more rounds"
        metrics: dict[str, float] = {}
        if not self.algo.dynamic_sampling:
            return *self.sampled[0], metrics
        if len(self.kept) < self.wanted:
            logger.warning(
                "dynamic sampling: %d of %d groups have distinct rewards after %d rollout batches "
                "(algorithm.max_sampling_rounds); filling with zero-advantage groups",
                len(self.kept),
                self.wanted,
                self.rounds,
            )
        metrics["dynamic_sampling/rollout_batches"] = float(self.rounds)
        metrics["dynamic_sampling/kept_groups"] = self.processes.sum(min(len(self.kept), self.wanted))
        metrics["dynamic_sampling/filled_groups"] = self.processes.sum(max(0, self.wanted - len(self.kept)))
        batch, scores = gather_groups(choose_groups(self.kept, self.dropped, self.wanted))
        return batch, scores, metrics
