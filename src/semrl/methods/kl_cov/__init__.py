"""KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs",
https://arxiv.org/abs/2505.22617): GRPO advantages; the policy-gradient loss without clipping,
plus ``ppo_kl_coef * |logp - old logp|`` on the ``ratio`` share of tokens with the highest
Cov(logp, A), selected per micro-batch as verl does: with few tokens per micro-batch the one-token
minimum penalises more than ``ratio`` of them (one of 100 tokens is 5x the default 0.002).

Pieces: this package (options, the method), ``loss`` (the ``kl_cov`` loss), ``token_losses.kl_cov_loss``
(the pure function), docs/algorithms.md "KL-Cov and Clip-Cov".
"""

from __future__ import annotations

from dataclasses import dataclass

from semrl.config.options import NON_NEGATIVE, OPEN_FRACTION, check_ranges, option
from semrl.methods.grpo import OUTCOME_ADVANTAGES
from semrl.methods.registry import MethodSpec, PolicyLoss, register_method, register_policy_loss


@dataclass(frozen=True)
class KLCovConfig:
    """The ``kl_cov`` config section, read when ``algorithm.method=kl_cov``."""

    ratio: float = option(
        0.002,
        "KL-Cov: fraction of a micro-batch's tokens (top Cov) given the |logp - old| penalty "
        "(verl: kl_cov_ratio).",
        valid=OPEN_FRACTION,
    )
    ppo_kl_coef: float = option(
        1.0,
        "KL-Cov: coefficient of the |logp - old logp| penalty (verl: ppo_kl_coef).",
        valid=NON_NEGATIVE,
    )

    def __post_init__(self) -> None:
        check_ranges(self, "kl_cov")


register_policy_loss(
    PolicyLoss(
        "kl_cov",
        "semrl.methods.kl_cov.loss:kl_cov",
        section="kl_cov",
        off_policy_term=lambda o: (
            f"the |logp - old logp| penalty (kl_cov.ppo_kl_coef={o.ppo_kl_coef})"
            if o.ppo_kl_coef > 0
            else None
        ),
    )
)


register_method(
    MethodSpec(
        name="kl_cov",
        advantage_fn=OUTCOME_ADVANTAGES,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="KL-Cov: |logp - old| penalty on the top-Cov tokens, no clipping (arXiv 2505.22617).",
        policy_loss="kl_cov",
        options=KLCovConfig,
    )
)
