"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs",
https://arxiv.org/abs/2505.22617): GRPO advantages and the PPO loss, with the gradient removed from
``ratio`` of a micro-batch's tokens drawn at random among those with ``lb < Cov(logp, A) < ub``.
The PPO clip defaults to 1 / 1 (ratio in [0, 2]), as the reference recipes set it.

Selection is per micro-batch, as verl's: with few tokens per micro-batch the one-token minimum
drops far more than ``ratio`` of the tokens (one of 100 tokens is 50x the default 0.0002); raise
``trainer.micro_batch_size`` to get nearer the nominal share. KL-Cov selects the same way.

Pieces: this module (options, the ``clip_cov`` loss, the method), ``token_selection.clip_cov_loss``
(the pure function), docs/algorithms.md "KL-Cov and Clip-Cov".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from semrl.algos.grpo import outcome_advantages
from semrl.algos.policy_losses import PolicyLoss, PolicyLossInputs, clip_range, register_policy_loss
from semrl.algos.registry import MethodConfig, MethodSpec, register_method
from semrl.algos.token_selection import clip_cov_loss
from semrl.options import FINITE, OPEN_FRACTION, check_ranges, option


@dataclass(frozen=True)
class ClipCovConfig:
    ratio: float = option(
        0.0002, "Clip-Cov: fraction of tokens whose gradient is removed (verl: clip_cov_ratio).",
        valid=OPEN_FRACTION,
    )
    lb: float = option(
        1.0, "Clip-Cov: lower covariance bound of candidate tokens (verl: clip_cov_lb).", valid=FINITE
    )
    ub: float = option(
        5.0, "Clip-Cov: upper covariance bound of candidate tokens (verl: clip_cov_ub).", valid=FINITE
    )

    def __post_init__(self) -> None:
        check_ranges(self, "clip_cov")


def clip_cov(
    x: PolicyLossInputs, config: MethodConfig[ClipCovConfig]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    a, c = config.algorithm, config.options
    return clip_cov_loss(
        x.logp, x.old_logp, x.advantages, x.mask, *clip_range(a), c.ratio, c.lb, c.ub,
        x.generator
    )


register_policy_loss(PolicyLoss("clip_cov", clip_cov, section="clip_cov"))
register_method(
    MethodSpec(
        name="clip_cov",
        advantage_fn=outcome_advantages,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="Clip-Cov: gradient removed from random high-Cov tokens (arXiv 2505.22617).",
        policy_loss="clip_cov",
        clip_ratio_low=1.0,
        clip_ratio_high=1.0,
        options=ClipCovConfig,
    )
)
