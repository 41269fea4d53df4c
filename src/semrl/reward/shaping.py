"""Reward shaping applied after verification."""

from __future__ import annotations

import torch


def overlong_penalty(
    lengths: torch.Tensor, max_length: int, buffer_length: int, penalty_factor: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment (docs/algorithms.md "DAPO"), added to the reward.

    0 up to ``max_length - buffer_length`` tokens, then falling linearly to ``-penalty_factor`` at
    ``max_length``. lengths: (N,) response lengths in tokens. Returns (N,) penalties <= 0.
    """
    if buffer_length <= 0:
        return torch.zeros(lengths.shape)
    exceed = lengths.float() - (max_length - buffer_length)
    return (-exceed / buffer_length * penalty_factor).clamp(max=0.0)
