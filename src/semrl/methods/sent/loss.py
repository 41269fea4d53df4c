"""SENT's policy loss (``algorithm.policy_loss=sent``): PPO plus the token KL on low-entropy,
high-covariance tokens (``semrl.methods.token_losses.sent_coefficients`` and ``sent_loss``).
"""

from __future__ import annotations

import torch

from semrl.methods.policy_loss import (
    MiniBatchInputs,
    PolicyLossInputs,
    clip_range,
)
from semrl.methods.registry import MethodConfig
from semrl.methods.sent import SentConfig
from semrl.methods.token_losses import sent_coefficients, sent_loss


def _beta(
    logp: torch.Tensor, entropy: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, s: SentConfig
) -> torch.Tensor:
    return sent_coefficients(
        entropy,
        logp,
        adv,
        mask,
        s.entropy_quantile,
        s.cov_top_ratio,
        s.beta_high,
        s.beta_low,
        s.beta_low_scope,
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
