"""Advantage estimators as pure tensor functions.

Every estimator returns a ``(num_sequences, response_tokens)`` tensor so that sequence-level,
token-level and tree (segment) advantages all plug into the same loss.
Definitions: docs/algorithms.md "Group-relative advantages".
"""

from __future__ import annotations

from typing import Any

import torch

from semrl.methods.interface import AdvantageInputs
from semrl.methods.registry import MethodConfig


def group_centered_rewards(
    rewards: torch.Tensor, group_ids: torch.Tensor, normalize_std: bool, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantage of every sequence.

    Args:
        rewards: (N,) scalar reward per sequence.
        group_ids: (N,) integer id of the prompt each sequence answers.
        normalize_std: divide by the (unbiased) group std, as GRPO does; Dr.GRPO does not.
        eps: added to the std, so all-equal groups give 0 rather than NaN.

    Returns:
        (N,) ``r_i - mean_group(r)`` or ``(r_i - mean) / (std + eps)``.
    """
    rewards = rewards.float()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    counts = torch.zeros(num_groups).index_add_(0, inverse, torch.ones_like(rewards))
    sums = torch.zeros(num_groups).index_add_(0, inverse, rewards)
    means = sums / counts
    centered = rewards - means[inverse]
    if not normalize_std:
        return centered
    sq = torch.zeros(num_groups).index_add_(0, inverse, centered**2)
    # Unbiased std like torch.std / TRL / verl; a group of one has std 0.
    var = sq / (counts - 1).clamp(min=1)
    return centered / (var.sqrt()[inverse] + eps)


def broadcast_to_tokens(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(N,) per-sequence values -> (N, T) per-token values, zero on padding."""
    return values[:, None] * response_mask.to(values.dtype)


def outcome_advantages(
    inputs: AdvantageInputs, config: MethodConfig[Any]
) -> tuple[torch.Tensor, dict[str, float]]:
    """(N, T) group-relative advantages, divided by the group std when ``algorithm.norm_adv_by_std``."""
    adv = group_centered_rewards(
        inputs.rewards, inputs.group_ids, normalize_std=bool(config.algorithm.norm_adv_by_std)
    )
    return broadcast_to_tokens(adv, inputs.response_mask), {}
