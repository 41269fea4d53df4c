"""Policy losses, KL estimators and loss aggregation as pure tensor functions.

All per-token tensors are ``(N, T)`` over response tokens with a 0/1 ``mask`` of the same shape.
Conventions follow verl ``core_algos``; docs/algorithms.md "Loss aggregation".
"""

from __future__ import annotations

from typing import Literal

import torch

LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k2", "k3"]
RolloutISLevel = Literal["none", "token", "sequence"]
RolloutISMode = Literal["truncate", "mask"]
LOG_RATIO_BOUND = 20.0  # log-ratios are clamped to +-this before exp (as verl), so that exp stays finite


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1 (0 if the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped surrogate with clip-higher and dual clip.

    ``loss_t = max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high))``; for ``A < 0`` the loss
    is further capped at ``-A * clip_c`` (dual clip, Ye et al. 2020). The log-ratio is clamped to
    [-20, 20] before ``exp`` like verl.

    Args:
        logp: (N, T) log-probs under the current policy.
        old_logp: (N, T) log-probs under the policy that sampled.
        advantages: (N, T).
        mask: (N, T) 1 on response tokens.

    Returns:
        per-token loss (N, T) (not yet aggregated) and metrics: ``clip_frac`` (tokens whose
        gradient the clip removed), ``dual_clip_frac``, ``approx_kl`` (mean of old - new).
    """
    log_ratio = clamped_log_ratio(logp, old_logp)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = {"clip_frac": masked_mean((clipped > unclipped).float(), mask)}
    if clip_c is not None:
        capped = torch.minimum(loss, -advantages * clip_c)
        dual = (advantages < 0) & (loss > -advantages * clip_c)
        loss = torch.where(advantages < 0, capped, loss)
        metrics["dual_clip_frac"] = masked_mean(dual.float(), mask)
    metrics["approx_kl"] = masked_mean(-log_ratio.detach(), mask)
    return loss, metrics


def clamped_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """log(pi / pi_old) per token, clamped to [-20, 20] so that ``exp`` stays finite (as verl)."""
    return (logp - old_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """pi / pi_old per token from log-probs, its log clamped (``clamped_log_ratio``)."""
    return torch.exp(clamped_log_ratio(logp, old_logp))


def rollout_correction(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    level: RolloutISLevel,
    cap: float,
    mode: RolloutISMode = "truncate",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Importance weights for the mismatch between the engine that sampled and the trainer
    (docs/algorithms.md "Rollout correction"): r = pi_old / pi_engine of each sampled token (the
    trainer's behaviour-policy probability over the engine's), or with ``level="sequence"`` its
    product over the response, given to every token of it.

    ``mode="truncate"`` (truncated IS, verl's TIS): w = min(r, cap); ``"mask"``: w = r where
    r <= cap, 0 where it is above (those tokens, or whole sequences, leave the loss). ``"none"``:
    w = 1, the metrics only. Log-ratios are clamped to [-20, 20] before ``exp``.

    Args:
        old_logp: (N, T) the trainer's log-probs of the sampled tokens.
        rollout_logp: (N, T) the engine's log-probs of the same tokens.
        mask: (N, T) 1 on response tokens.

    Returns:
        (N, T) detached weights (0 on padding) and metrics: ``mismatch_kl`` (k3 estimate of
        KL(pi_engine || pi_old) per token), ``ratio_mean``, ``ratio_max`` and ``capped_frac`` over
        valid tokens.
    """
    mask = mask.float()
    token_log_ratio = ((old_logp - rollout_logp) * mask).detach()
    log_ratio = token_log_ratio
    if level == "sequence":
        log_ratio = token_log_ratio.sum(dim=1, keepdim=True).expand_as(mask)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    capped = (ratio > cap) & mask.bool()
    if level == "none":
        weights = mask
    elif mode == "truncate":
        weights = ratio.clamp(max=cap) * mask
    else:
        weights = torch.where(capped, torch.zeros_like(ratio), ratio) * mask
    # k3 = e^d - d - 1 ~ d^2 / 2: in float64 and with expm1, or a small mismatch rounds to 0
    clamped = token_log_ratio.double().clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    metrics = {
        "mismatch_kl": masked_mean(torch.expm1(clamped) - clamped, mask.double()).float(),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": (ratio * mask).max() if mask.any() else torch.tensor(1.0),
        "capped_frac": masked_mean(capped.float(), mask),
    }
    return weights, metrics


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from sampled-token log-probs.

    k1 = logp - ref; k2 = (logp - ref)^2 / 2; k3 = exp(ref - logp) - (ref - logp) - 1
    (Schulman's low-variance estimator; log-ratio clamped to [-20, 20], result to [-10, 10]
    as in verl's ``low_var_kl``).
    """
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if estimator == "k3":
        log_ratio = clamped_log_ratio(ref_logp, logp)
        return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator '{estimator}'; use k1, k2 or k3")


def aggregate_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAggMode,
    *,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    max_response_length: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss (N, T) of one micro-batch to a scalar.

    The denominators are those of the whole *mini-batch* (one optimizer step) when given, so
    the gradients of its micro-batches simply add up: no division by the accumulation count,
    and no dependence on how the mini-batch is split.

    Modes:
        token-mean: sum of all token losses / ``num_tokens`` (valid tokens of the mini-batch).
        seq-mean-token-mean: sum over sequences of the per-sequence token mean / ``num_sequences``.
        seq-mean-token-sum-norm (Dr.GRPO): sum over sequences of the per-sequence token sum,
            / ``max_response_length``, / ``num_sequences``. Unlike verl (issue #3741) this is a
            mean over sequences, matching the Dr.GRPO reference code (docs/algorithms.md "Loss aggregation").
    """
    mask = mask.to(loss.dtype)
    if mode == "token-mean":
        denom = num_tokens if num_tokens is not None else mask.sum().clamp(min=1)
        return (loss * mask).sum() / denom
    n_seq = num_sequences if num_sequences is not None else loss.shape[0]
    if mode == "seq-mean-token-mean":
        per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / n_seq
    if mode == "seq-mean-token-sum-norm":
        if max_response_length is None:
            raise ValueError("seq-mean-token-sum-norm needs max_response_length")
        per_seq = (loss * mask).sum(-1) / max_response_length
        return per_seq.sum() / n_seq
    raise ValueError(f"unknown loss_agg_mode '{mode}'")
