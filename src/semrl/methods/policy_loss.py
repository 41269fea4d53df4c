"""The per-token policy losses' inputs, the plain PPO-clip loss, and the scalar loss of a micro-batch.

A policy loss (``semrl.methods.registry.PolicyLoss``, named by ``algorithm.policy_loss``) maps a
micro-batch's ``PolicyLossInputs`` to a per-token loss (n, T); ``micro_batch_loss`` weights it by the
rollout correction, adds the KL to the reference and the entropy bonus, and aggregates it with
``algorithm.loss_agg_mode``. A loss that selects tokens over the whole mini-batch has a
``prepare_fn`` that reads ``MiniBatchInputs``. Loss functions receive a ``MethodConfig``: the options
section the loss names in ``PolicyLoss.section`` (None: none) and the ``algorithm`` and ``rollout``
sections. Methods with their own loss keep it in their folder (``semrl.methods.kl_cov.loss``,
``clip_cov``, ``entropy_8020``, ``sent``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from semrl.methods.losses import aggregate_loss, kl_penalty, masked_mean, ppo_clip_loss, rollout_correction
from semrl.methods.registry import MethodConfig

if TYPE_CHECKING:
    from semrl.config.sections import AlgorithmConfig


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
        generator: the process's random stream (Clip-Cov's random choice).
        num_tokens: valid tokens of the whole mini-batch over every process (token-mean's denominator).
        num_micro_batches: micro-batches of the mini-batch over every process.
        rollout_logp: the sampling engine's log-probs of the tokens (rollout correction), or None.
        entropy_coeff: the entropy bonus's coefficient at this optimizer step (0: none).
        bonus_entropy: the current entropy with its gradient, read when ``entropy_coeff`` != 0.
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    selection: dict[str, torch.Tensor] = field(default_factory=dict)
    generator: torch.Generator | None = None
    num_tokens: int = 0
    num_micro_batches: int = 1
    rollout_logp: torch.Tensor | None = None
    entropy_coeff: float = 0.0
    bonus_entropy: torch.Tensor | None = None


@dataclass
class MiniBatchInputs:
    """Rollout-time (behaviour policy) tensors of a whole mini-batch, each (n, T)."""

    logp: torch.Tensor
    entropy: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor


# (micro-batch, config) -> ((n, T) per-token loss, metrics)
LossFn = Callable[[PolicyLossInputs, MethodConfig[Any]], tuple[torch.Tensor, dict[str, torch.Tensor]]]
# (mini-batch, config) -> per-token selections
PrepareFn = Callable[[MiniBatchInputs, MethodConfig[Any]], dict[str, torch.Tensor]]


def clip_range(algorithm: AlgorithmConfig) -> tuple[float, float]:
    """(``clip_ratio_low``, ``clip_ratio_high``) of the ``algorithm`` section, which loading a config
    fills from the method's defaults where it leaves them null."""
    low, high = algorithm.clip_ratio_low, algorithm.clip_ratio_high
    if low is None or high is None:
        raise ValueError("algorithm.clip_ratio_low / _high are null: build the config with load_config")
    return low, high


def ppo(x: PolicyLossInputs, config: MethodConfig[Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    a = config.algorithm
    return ppo_clip_loss(x.logp, x.old_logp, x.advantages, x.mask, *clip_range(a), a.clip_ratio_c)


def micro_batch_loss(
    loss_fn: LossFn, x: PolicyLossInputs, config: MethodConfig[Any], num_sequences: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """The scalar loss of one micro-batch: ``loss_fn``'s per-token loss, weighted by the rollout
    correction (``algorithm.rollout_is``) when ``x.rollout_logp`` is given, plus
    ``algorithm.kl_coef`` x the KL to the reference when ``x.ref_logp`` is given, aggregated with the
    mini-batch's denominators (``num_sequences`` and ``x.num_tokens`` over every process) so that
    micro-batch gradients add up, minus ``x.entropy_coeff`` x the entropy aggregated the same way
    (the entropy bonus, docs/algorithms.md "Entropy bonus"). Returns (loss, the policy loss's
    metrics, the correction's as ``rollout_is/...`` and the bonus's aggregated entropy as
    ``entropy_bonus``, masked-mean KL or None)."""
    a = config.algorithm
    token_loss, metrics = loss_fn(x, config)
    if x.rollout_logp is not None:
        weights, correction = rollout_correction(
            x.old_logp, x.rollout_logp, x.mask, a.rollout_is, a.rollout_is_cap, a.rollout_is_mode
        )
        if a.rollout_is != "none":  # "none": the mismatch is measured, not corrected
            token_loss = token_loss * weights
        metrics = {**metrics, **{f"rollout_is/{k}": v for k, v in correction.items()}}
    kl_mean = None
    if x.ref_logp is not None:
        kl = kl_penalty(x.logp, x.ref_logp, a.kl_estimator)
        if a.kl_coef > 0:
            token_loss = token_loss + a.kl_coef * kl
        kl_mean = masked_mean(kl.detach(), x.mask)
    mode = a.loss_agg_mode
    if mode is None:
        raise ValueError("algorithm.loss_agg_mode is null: build the config with load_config")

    def aggregate(values: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(
            values,
            x.mask,
            mode,
            num_sequences=num_sequences,
            num_tokens=x.num_tokens,
            max_response_length=config.rollout.max_new_tokens,
        )

    total = aggregate(token_loss)
    if x.entropy_coeff != 0:
        if x.bonus_entropy is None:
            raise ValueError("the entropy bonus needs PolicyLossInputs.bonus_entropy (with its gradient)")
        bonus = aggregate(x.bonus_entropy)
        total = total - x.entropy_coeff * bonus
        metrics = {**metrics, "entropy_bonus": bonus.detach()}
    return total, metrics, kl_mean
