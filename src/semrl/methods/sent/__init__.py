"""SENT (arXiv 2512.04359, https://arxiv.org/abs/2512.04359): efficient RL with semantic and token
entropy, inside GRPO.

* Token level (this module): GRPO advantages; the ``sent`` policy loss adds a token KL with
  coefficient ``beta_high`` on the low-entropy tokens of highest Cov(logp, A) and ``beta_low`` on
  the other regularised low-entropy tokens. The pure functions are
  ``token_losses.sent_coefficients`` and ``token_losses.sent_loss`` (the loss: ``semrl.methods.sent.loss``).
* Data level: a curriculum of increasing semantic entropy: ``semrl curriculum score`` writes the
  per-problem semantic entropy (``semrl.evaluation.difficulty.score_problems``), ``data.curriculum`` trains in
  stages (``semrl.data.curriculum.StageSchedule``).

Formulas, and where the SENT code differs from the paper (each difference is an option here):
docs/algorithms.md "SENT".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from semrl.config.options import NON_NEGATIVE, OPEN_FRACTION, check_ranges, option
from semrl.methods.grpo import OUTCOME_ADVANTAGES
from semrl.methods.registry import MethodSpec, PolicyLoss, register_method, register_policy_loss


@dataclass(frozen=True)
class SentConfig:
    """The ``sent`` config section, read when ``algorithm.method=sent``."""

    entropy_quantile: float = option(
        0.8, "SENT: tokens below this entropy rank quantile are low-entropy.", valid=OPEN_FRACTION
    )
    cov_top_ratio: float = option(
        0.0002,
        "SENT: fraction of low-entropy tokens with the highest Cov(logp, A) given beta_high.",
        valid=OPEN_FRACTION,
    )
    beta_high: float = option(
        0.2, "SENT: KL coefficient on high-covariance low-entropy tokens.", valid=NON_NEGATIVE
    )
    beta_low: float = option(
        0.05, "SENT: KL coefficient on the other regularised low-entropy tokens.", valid=NON_NEGATIVE
    )
    beta_low_scope: Literal["rest_of_low", "bottom_cov_ratio"] = option(
        "rest_of_low", "beta_low on all other low-entropy tokens (paper) or only the bottom-Cov ones (code)."
    )
    kl_target: Literal["old_abs", "ref_k3"] = option(
        "old_abs",
        "Token KL: |logp - old logp| (code; no effect on a "
        "single on-policy update) or k3 to the reference (paper).",
    )
    selection_scope: Literal["mini", "micro"] = option(
        "mini", "Select tokens over the whole mini-batch (ours) or each micro-batch (code)."
    )
    clip_in_sent_loss: bool = option(False, "PPO-clip the SENT policy term (the code does not clip).")

    def __post_init__(self) -> None:
        check_ranges(self, "sent")


register_policy_loss(
    PolicyLoss(
        "sent",
        "semrl.methods.sent.loss:sent",
        prepare_fn="semrl.methods.sent.loss:select_sent_tokens",
        section="sent",
        needs_reference=lambda options: options.kl_target == "ref_k3",
        off_policy_term=lambda o: (
            "the token penalty |logp - old logp| (sent.kl_target=old_abs)"
            if o.kl_target == "old_abs" and (o.beta_high > 0 or o.beta_low > 0)
            else None
        ),
    )
)


register_method(
    MethodSpec(
        name="sent",
        advantage_fn=OUTCOME_ADVANTAGES,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="SENT: GRPO with token-level KL on low-entropy, high-covariance tokens "
        "(arXiv 2512.04359); "
        "curriculum via data.curriculum.",
        policy_loss="sent",
        options=SentConfig,
    )
)
