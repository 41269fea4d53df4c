"""Registry of per-token policy losses (cf. verl ``policy_loss.loss_mode``).

A policy loss maps a micro-batch's ``PolicyLossInputs`` to a per-token loss (N, T) that the
trainer aggregates with ``algorithm.loss_agg_mode`` and adds the KL-to-reference term to. A loss
that selects tokens over the whole mini-batch (not the micro-batch) has a ``prepare_fn``: the
trainer calls it once per mini-batch with rollout-time tensors, and passes its per-token outputs,
sliced to the micro-batch, as ``inputs.selection``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from semrl.algos.losses import ppo_clip_loss
from semrl.algos.token_selection import (
    clip_cov_loss,
    high_entropy_mask,
    kl_cov_loss,
    sent_coefficients,
    sent_loss,
)


@dataclass
class PolicyLossInputs:
    """One micro-batch. Tensors are (n, T) over response tokens.

    Attributes:
        logp: current log-probs (with gradient).
        old_logp: behaviour-policy log-probs.
        advantages: per-token advantages.
        mask: 1 on valid response tokens.
        entropy: current full-vocabulary entropy (detached), or None.
        ref_logp: reference-model log-probs, or None.
        selection: outputs of the loss's ``prepare_fn`` for these rows.
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    selection: dict[str, torch.Tensor] = field(default_factory=dict)
    generator: torch.Generator | None = None


@dataclass
class MiniBatchInputs:
    """Rollout-time (behaviour policy) tensors of a whole mini-batch, each (n, T)."""

    logp: torch.Tensor
    entropy: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor


LossFn = Callable[[PolicyLossInputs, Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]
PrepareFn = Callable[[MiniBatchInputs, Any], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class PolicyLoss:
    name: str
    loss_fn: LossFn
    prepare_fn: PrepareFn | None = None
    needs_reference: Callable[[Any], bool] = lambda cfg: False


POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(loss: PolicyLoss) -> PolicyLoss:
    if loss.name in POLICY_LOSSES:
        raise ValueError(f"policy loss '{loss.name}' is already registered")
    POLICY_LOSSES[loss.name] = loss
    return loss


def get_policy_loss(name: str) -> PolicyLoss:
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise KeyError(f"unknown policy loss '{name}'; available: {', '.join(sorted(POLICY_LOSSES))}") from None


# ----------------------------------------------------------------------------------------------
# Built-in losses. ``cfg`` is the whole Config.


def _ppo(x: PolicyLossInputs, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    a = cfg.algorithm
    return ppo_clip_loss(x.logp, x.old_logp, x.advantages, x.mask, a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c)


def _kl_cov(x: PolicyLossInputs, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    a = cfg.algorithm
    return kl_cov_loss(x.logp, x.old_logp, x.advantages, x.mask, a.kl_cov_ratio, a.ppo_kl_coef)


def _clip_cov(x: PolicyLossInputs, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    a = cfg.algorithm
    return clip_cov_loss(
        x.logp, x.old_logp, x.advantages, x.mask, a.clip_ratio_low, a.clip_ratio_high,
        a.clip_cov_ratio, a.clip_cov_lb, a.clip_cov_ub, x.generator,
    )


def _high_entropy_prepare(mb: MiniBatchInputs, cfg: Any) -> dict[str, torch.Tensor]:
    return {"keep": high_entropy_mask(mb.entropy, mb.mask, cfg.algorithm.top_entropy_quantile)}


def _high_entropy(x: PolicyLossInputs, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO loss on the mini-batch's top-entropy tokens only ("Beyond the 80/20 rule")."""
    loss, metrics = _ppo(x, cfg)
    keep = x.selection["keep"]
    metrics["high_entropy_frac"] = (keep & x.mask.bool()).float().sum() / x.mask.sum().clamp(min=1)
    return torch.where(keep, loss, torch.zeros_like(loss)), metrics


def _sent_beta(logp: torch.Tensor, entropy: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg: Any) -> torch.Tensor:
    s = cfg.sent
    return sent_coefficients(
        entropy, logp, adv, mask, s.entropy_quantile, s.cov_top_ratio, s.beta_high, s.beta_low, s.beta_low_scope
    )


def _sent_prepare(mb: MiniBatchInputs, cfg: Any) -> dict[str, torch.Tensor]:
    if cfg.sent.selection_scope != "mini":
        return {}
    return {"beta": _sent_beta(mb.logp, mb.entropy, mb.advantages, mb.mask, cfg)}


def _sent(x: PolicyLossInputs, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    s, a = cfg.sent, cfg.algorithm
    if "beta" in x.selection:
        beta = x.selection["beta"]
    else:  # micro-batch scope, from the current policy (the code's behaviour)
        if x.entropy is None:
            raise ValueError("sent.selection_scope='micro' needs the current entropy")
        beta = _sent_beta(x.logp, x.entropy, x.advantages, x.mask, cfg)
    clip = (a.clip_ratio_low, a.clip_ratio_high) if s.clip_in_sent_loss else None
    return sent_loss(x.logp, x.old_logp, x.advantages, x.mask, beta, s.kl_target, x.ref_logp, clip, s.beta_high)


register_policy_loss(PolicyLoss("ppo", _ppo))
register_policy_loss(PolicyLoss("kl_cov", _kl_cov))
register_policy_loss(PolicyLoss("clip_cov", _clip_cov))
register_policy_loss(PolicyLoss("high_entropy", _high_entropy, prepare_fn=_high_entropy_prepare))
register_policy_loss(
    PolicyLoss("sent", _sent, prepare_fn=_sent_prepare, needs_reference=lambda cfg: cfg.sent.kl_target == "ref_k3")
)
