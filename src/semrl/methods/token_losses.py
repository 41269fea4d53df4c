"""Entropy-control policy losses as pure tensor functions: KL-Cov, Clip-Cov, SENT, and the
80/20 high-entropy token mask.

Every per-token tensor is ``(N, T)`` with a 0/1 ``mask`` of valid response tokens. Selections
are boolean masks of the same shape (never integer-mask indexing, which scrambles the SENT code's
ranking; docs/algorithms.md "SENT"). Covariances use detached log-probs: they choose tokens, they
are not differentiated.
"""

from __future__ import annotations

from typing import Literal

import torch

from semrl.methods.losses import importance_ratio, kl_penalty, ppo_clip_loss

BetaLowScope = Literal["rest_of_low", "bottom_cov_ratio"]
KLTarget = Literal["old_abs", "ref_k3"]


def token_covariance(logp: torch.Tensor, advantages: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """Cov_t = (A_t - mean A)(logp_t - mean logp), means over the selected tokens; 0 elsewhere.

    docs/algorithms.md "KL-Cov and Clip-Cov" (micro-batch valid tokens) and "SENT" (over the low-entropy set).
    """
    select = select.bool()
    n = select.sum().clamp(min=1)
    logp = logp.detach()
    mean_logp = (logp * select).sum() / n
    mean_adv = (advantages * select).sum() / n
    return torch.where(select, (advantages - mean_adv) * (logp - mean_logp), torch.zeros_like(logp))


def top_k_mask(scores: torch.Tensor, select: torch.Tensor, k: int, largest: bool = True) -> torch.Tensor:
    """Boolean mask of the ``k`` selected positions with the largest (or smallest) score."""
    select = select.bool()
    k = min(k, int(select.sum()))
    out = torch.zeros_like(select)
    if k <= 0:
        return out
    fill = float("-inf") if largest else float("inf")
    idx = torch.topk(scores.masked_fill(~select, fill).flatten(), k, largest=largest).indices
    out.view(-1)[idx] = True
    return out


def low_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """The ``max(1, floor(quantile * N_valid))`` valid tokens with the smallest entropy (rank-based,
    like SENT's code: H below the ``quantile``-quantile of the selection scope)."""
    n_valid = int(mask.bool().sum())
    return top_k_mask(entropy, mask, max(1, int(quantile * n_valid)) if n_valid else 0, largest=False)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_fraction: float) -> torch.Tensor:
    """The top ``top_fraction`` valid tokens by entropy ("Beyond the 80/20 rule": 0.2)."""
    n_valid = int(mask.bool().sum())
    return top_k_mask(entropy, mask, max(1, int(top_fraction * n_valid)) if n_valid else 0, largest=True)


def kl_cov_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kl_cov_ratio: float,
    ppo_kl_coef: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov (docs/algorithms.md "KL-Cov and Clip-Cov"): -A rho on every token, no clipping; the top
    ``max(1, floor(ratio * N_valid))`` tokens by Cov(logp, A) add ``ppo_kl_coef * |logp - old_logp|``.

    Returns per-token loss (N, T) and metrics (``kl_cov_frac``: share of valid tokens penalised).
    """
    valid = mask.bool()
    loss = -advantages * importance_ratio(logp, old_logp)
    n_valid = int(valid.sum())
    chosen = top_k_mask(token_covariance(logp, advantages, valid), valid, max(1, int(kl_cov_ratio * n_valid)))
    loss = loss + torch.where(chosen, ppo_kl_coef * (logp - old_logp).abs(), torch.zeros_like(loss))
    return loss, {"kl_cov_frac": chosen.float().sum() / max(1, n_valid)}


def clip_cov_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_cov_ratio: float,
    cov_lb: float,
    cov_ub: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov (docs/algorithms.md "KL-Cov and Clip-Cov"): the PPO loss, then
    ``max(1, floor(ratio * N_valid))``
    tokens drawn at random among the unclipped valid tokens with ``cov_lb < Cov < cov_ub`` lose
    their gradient (loss set to 0)."""
    valid = mask.bool()
    loss, metrics = ppo_clip_loss(logp, old_logp, advantages, mask, clip_low, clip_high, clip_c=None)
    unclipped = -advantages * importance_ratio(logp, old_logp)
    not_clipped = (loss.detach() == unclipped.detach()) & valid
    cov = token_covariance(logp, advantages, valid)
    candidates = not_clipped & (cov > cov_lb) & (cov < cov_ub)
    n_pick = min(max(1, int(clip_cov_ratio * int(valid.sum()))), int(candidates.sum()))
    drop = torch.zeros_like(valid)
    if n_pick > 0:
        idx = candidates.flatten().nonzero().flatten()
        pick = idx[torch.randperm(len(idx), generator=generator)[:n_pick]]
        drop.view(-1)[pick] = True
    loss = torch.where(drop, torch.zeros_like(loss), loss)
    metrics["clip_cov_frac"] = drop.float().sum() / max(1, int(valid.sum()))
    return loss, metrics


def sent_coefficients(
    entropy: torch.Tensor,
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    entropy_quantile: float,
    cov_top_ratio: float,
    beta_high: float,
    beta_low: float,
    beta_low_scope: BetaLowScope = "rest_of_low",
) -> torch.Tensor:
    """SENT's per-token KL coefficient beta_con (N, T), docs/algorithms.md "SENT".

    Low-entropy set T_low: valid tokens with H below the ``entropy_quantile`` rank. Among them the
    ``m = max(1, floor(cov_top_ratio * |T_low|))`` tokens with the largest Cov(logp, A) (covariance
    over T_low) get ``beta_high``. ``beta_low`` goes to the rest of T_low (paper,
    ``rest_of_low``) or only to the m tokens with the smallest Cov (code, ``bottom_cov_ratio``).
    Tokens outside T_low get 0.
    """
    low = low_entropy_mask(entropy, mask, entropy_quantile)
    cov = token_covariance(logp, advantages, low)
    m = max(1, int(cov_top_ratio * int(low.sum())))
    high = top_k_mask(cov, low, m, largest=True)
    if beta_low_scope == "rest_of_low":
        low_beta = low & ~high
    elif beta_low_scope == "bottom_cov_ratio":
        low_beta = top_k_mask(cov, low & ~high, m, largest=False)
    else:
        raise ValueError(f"unknown beta_low_scope '{beta_low_scope}'")
    beta = torch.zeros_like(entropy, dtype=torch.float32)
    beta = torch.where(low_beta, torch.full_like(beta, beta_low), beta)
    return torch.where(high, torch.full_like(beta, beta_high), beta)


def sent_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    beta: torch.Tensor,
    kl_target: KLTarget = "old_abs",
    ref_logp: torch.Tensor | None = None,
    clip: tuple[float, float] | None = None,
    beta_high: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SENT token loss: the policy-gradient term plus ``beta_t * KL_t`` (beta from
    ``sent_coefficients``; ``beta_high`` only names which tokens the ``sent_high_frac`` metric counts).

    KL_t is ``|logp - old_logp|`` (``old_abs``, the code) or k3 to the reference (``ref_k3``, the
    paper). ``clip=None`` is the code's unclipped ``-A rho``; ``(low, high)`` uses the PPO clip.
    """
    if clip is None:
        loss = -advantages * importance_ratio(logp, old_logp)
        metrics: dict[str, torch.Tensor] = {}
    else:
        loss, metrics = ppo_clip_loss(logp, old_logp, advantages, mask, clip[0], clip[1], clip_c=None)
    if kl_target == "old_abs":
        kl = (logp - old_logp).abs()
    elif kl_target == "ref_k3":
        if ref_logp is None:
            raise ValueError("kl_target='ref_k3' needs reference log-probs")
        kl = kl_penalty(logp, ref_logp, "k3")
    else:
        raise ValueError(f"unknown kl_target '{kl_target}'")
    valid = mask.bool()
    n = max(1, int(valid.sum()))
    metrics["sent_high_frac"] = ((beta == beta_high) & valid).float().sum() / n
    metrics["sent_regularised_frac"] = ((beta > 0) & valid).float().sum() / n
    return loss + beta * kl, metrics
