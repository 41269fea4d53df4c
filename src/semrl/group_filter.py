"""DAPO's dynamic sampling: keep the prompt groups whose rewards differ (docs/algorithms.md, "DAPO")."""

from __future__ import annotations

from typing import Literal

import torch

from semrl.batch import RolloutBatch

GroupRef = tuple[RolloutBatch, int]  # (batch, group index in it)


def informative_groups(batch: RolloutBatch, metric: Literal["reward", "accuracy"]) -> torch.Tensor:
    """(num_groups,) True where the group's rewards (or correctness) are not all equal."""
    grouped = batch.group_rewards() if metric == "reward" else batch.group_correct()
    return grouped.max(1).values > grouped.min(1).values


def split_groups(batch: RolloutBatch, metric: Literal["reward", "accuracy"]) -> tuple[list[GroupRef], list[GroupRef]]:
    """(kept, dropped) groups of ``batch``, in batch order."""
    informative = informative_groups(batch, metric)
    kept = [(batch, g) for g in range(batch.num_groups) if informative[g]]
    dropped = [(batch, g) for g in range(batch.num_groups) if not informative[g]]
    return kept, dropped


def choose_groups(kept: list[GroupRef], dropped: list[GroupRef], wanted: int) -> list[GroupRef]:
    """The first ``wanted`` kept groups, filled up with dropped ones (whose advantages are zero)."""
    return (kept + dropped)[:wanted]
