"""SENT (arXiv 2512.04359, https://arxiv.org/abs/2512.04359): efficient RL with semantic and token
entropy, inside GRPO.

* Token level (this module): GRPO advantages; the ``sent`` policy loss adds a token KL with
  coefficient ``beta_high`` on the low-entropy tokens of highest Cov(logp, A) and ``beta_low`` on
  the other regularised low-entropy tokens. The pure functions are
  ``token_selection.sent_coefficients`` and ``token_selection.sent_loss``.
* Data level: a curriculum of increasing semantic entropy: ``semrl curriculum score`` writes the
  per-problem semantic entropy (``semrl.curriculum.score_problems``), ``data.curriculum`` trains in
  stages (``semrl.curriculum.StageSchedule``).

Formulas, and where the SENT code differs from the paper (each difference is an option here):
docs/algorithms.md "SENT".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from semrl.algos.grpo import outcome_advantages
from semrl.algos.policy_losses import (
    MiniBatchInputs,
    PolicyLoss,
    PolicyLossInputs,
    clip_range,
    register_policy_loss,
)
from semrl.algos.registry import MethodConfig, MethodSpec, register_method
from semrl.algos.token_selection import sent_coefficients, sent_loss
from semrl.options import NON_NEGATIVE, OPEN_FRACTION, check_ranges, option


@dataclass(frozen=True)
class SentConfig:
    entropy_quantile: float = option(
        0.8, "SENT: tokens below this entropy rank quantile are low-entropy.", valid=OPEN_FRACTION
    )
    cov_top_ratio: float = option(
        0.0002, "SENT: fraction of low-entropy tokens with the highest Cov(logp, A) given beta_high.",
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
        "single on-policy update) or k3 to the reference (paper)."
    )
    selection_scope: Literal["mini", "micro"] = option(
        "mini", "Select tokens over the whole mini-batch (ours) or each micro-batch (code)."
    )
    clip_in_sent_loss: bool = option(False, "PPO-clip the SENT policy term (the code does not clip).")

    def __post_init__(self) -> None:
        check_ranges(self, "sent")


def _beta(
    logp: torch.Tensor, entropy: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, s: SentConfig
) -> torch.Tensor:
    return sent_coefficients(
        entropy, logp, adv, mask, s.entropy_quantile, s.cov_top_ratio, s.beta_high, s.beta_low,
        s.beta_low_scope
    )


def select_sent_tokens(mb: MiniBatchInputs, config: MethodConfig[SentConfig]) -> dict[str, torch.Tensor]:
    """Per-token beta over the whole mini-batch from rollout-time tensors (``selection_scope=mini``)."""
    if config.options.selection_scope != "mini":
        return {}
    return {"beta": _beta(mb.logp, mb.entropy, mb.advantages, mb.mask, config.options)}


def sent(
    x: PolicyLossInputs, config: MethodConfig[SentConfig]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    s, a = config.options, config.algorithm
    if "beta" in x.selection:
        beta = x.selection["beta"]
    else:  # micro-batch scope, from the current policy (the code's behaviour)
        if x.entropy is None:
            raise ValueError("sent.selection_scope='micro' needs the current entropy")
        beta = _beta(x.logp, x.entropy, x.advantages, x.mask, s)
    clip = clip_range(a) if s.clip_in_sent_loss else None
    return sent_loss(
        x.logp, x.old_logp, x.advantages, x.mask, beta, s.kl_target, x.ref_logp, clip, s.beta_high
    )


register_policy_loss(
    PolicyLoss(
        "sent", sent, prepare_fn=select_sent_tokens, section="sent",
        needs_reference=lambda options: options.kl_target == "ref_k3",
        off_policy_term=lambda o: "the token penalty |logp - old logp| (sent.kl_target=old_abs)"
        if o.kl_target == "old_abs" and (o.beta_high > 0 or o.beta_low > 0) else None,
    )
)
register_method(
    MethodSpec(
        name="sent",
        advantage_fn=outcome_advantages,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="SENT: GRPO with token-level KL on low-entropy, high-covariance tokens "
        "(arXiv 2512.04359); "
        "curriculum via data.curriculum.",
        policy_loss="sent",
        options=SentConfig,
    )
)
