"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs",
https://arxiv.org/abs/2505.22617): GRPO advantages and the PPO loss, with the gradient removed from
``ratio`` of a micro-batch's tokens drawn at random among those with ``lb < Cov(logp, A) < ub``.
The PPO clip defaults to 1 / 1 (ratio in [0, 2]), as the reference recipes set it.

Selection is per micro-batch, as verl's: with few tokens per micro-batch the one-token minimum
drops far more than ``ratio`` of the tokens (one of 100 tokens is 50x the default 0.0002); raise
``trainer.micro_batch_size`` to get nearer the nominal share. KL-Cov selects the same way.

Pieces: this package (options, the method), ``loss`` (the ``clip_cov`` loss), ``token_losses.clip_cov_loss``
(the pure function), docs/algorithms.md "KL-Cov and Clip-Cov".
"""

from __future__ import annotations

from dataclasses import dataclass

from semrl.config.options import FINITE, OPEN_FRACTION, check_ranges, option
from semrl.methods.grpo import OUTCOME_ADVANTAGES
from semrl.methods.registry import MethodSpec, PolicyLoss, register_method, register_policy_loss


@dataclass(frozen=True)
class ClipCovConfig:
    """The ``clip_cov`` config section, read when ``algorithm.method=clip_cov``."""

    ratio: float = option(
        0.0002,
        "Clip-Cov: fraction of tokens whose gradient is removed (verl: clip_cov_ratio).",
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


register_policy_loss(PolicyLoss("clip_cov", "semrl.methods.clip_cov.loss:clip_cov", section="clip_cov"))


register_method(
    MethodSpec(
        name="clip_cov",
        advantage_fn=OUTCOME_ADVANTAGES,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="Clip-Cov: gradient removed from random high-Cov tokens (arXiv 2505.22617).",
        policy_loss="clip_cov",
        clip_ratio_low=1.0,
        clip_ratio_high=1.0,
        options=ClipCovConfig,
    )
)
