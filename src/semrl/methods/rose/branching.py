"""ROSE branching scores: generation entropy x semantic divergence of the top-k candidates.

Pure functions over the rollout's top-k log-probs and ids and the model's L2-normalised input
embedding matrix. Definitions and the paper-vs-code differences: docs/algorithms.md
"ROSE: branching metric" (ROSE paper eqs. 1-3; the ROSE code's ``branch_metric="cosine-entropy"``).
"""

from __future__ import annotations

from typing import Literal, cast

import torch

EntropyMode = Literal["topk_logprobs", "full_vocab"]
SDMode = Literal["rose", "normalized"]
BranchMetric = Literal["semantic_entropy", "entropy", "divergence", "random"]


def normalized_embeddings(embedding_weight: torch.Tensor) -> torch.Tensor:
    """(V, D) input-embedding rows scaled to unit L2 norm. Compute once per model, not per call."""
    weight = embedding_weight.detach().float()
    return cast("torch.Tensor", weight / weight.norm(dim=-1, keepdim=True).clamp(min=1e-12))


def topk_entropy(top_logprobs: torch.Tensor) -> torch.Tensor:
    """Truncated, un-renormalised entropy ``-sum_i p_i log p_i`` over the given candidates.

    This is what ROSE's code computes from vLLM's top-20 log-prob dictionary (section 1.2 step 2).
    top_logprobs: (..., K) -> (...).
    """
    return -(top_logprobs.exp() * top_logprobs).sum(-1)


def pairwise_similarity_mass(
    top_logprobs: torch.Tensor, top_ids: torch.Tensor, unit_embeddings: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``F = sum_{i != j} p_i p_j cos(e_i, e_j)`` and ``M = sum_{i != j} p_i p_j``.

    Uses ``F = ||sum_i p_i e_i||^2 - sum_i p_i^2`` (unit-norm rows), so the cost is O(K D) per
    position instead of O(K^2 D). p_i = exp(logprob_i), not renormalised (as in ROSE's code).

    Args:
        top_logprobs: (..., K) log-probs of the K candidates.
        top_ids: (..., K) their token ids.
        unit_embeddings: (V, D) from ``normalized_embeddings``.
    Returns:
        F (...), M (...).
    """
    p = top_logprobs.float().exp()
    emb = unit_embeddings[top_ids]  # (..., K, D)
    y = (p.unsqueeze(-1) * emb).sum(-2)  # (..., D)
    p_sq = (p * p).sum(-1)
    similarity = (y * y).sum(-1) - p_sq
    mass = p.sum(-1) ** 2 - p_sq
    return similarity, mass


def semantic_divergence(
    top_logprobs: torch.Tensor, top_ids: torch.Tensor, unit_embeddings: torch.Tensor, mode: SDMode = "rose"
) -> torch.Tensor:
    """Semantic divergence of the top-k candidates at each position, (..., K) -> (...).

    ``rose`` (default, ROSE's code): ``SD = -sum_{i != j} p_i p_j cos_ij``; usually <= 0, and 0
    both for orthogonal candidates and for a near-deterministic position.
    ``normalized`` (our deviation, section 1.2 recommendation): ``SD = 1 - F / M`` in [0, 2]:
    0 for identical candidate embeddings, 1 for orthogonal ones, whatever their mass.
    """
    similarity, mass = pairwise_similarity_mass(top_logprobs, top_ids, unit_embeddings)
    if mode == "rose":
        return -similarity
    if mode == "normalized":
        return torch.where(mass > 1e-12, 1.0 - similarity / mass.clamp(min=1e-12), torch.zeros_like(mass))
    raise ValueError(f"unknown sd_mode '{mode}'; use 'rose' or 'normalized'")


def branch_scores(
    top_logprobs: torch.Tensor,
    top_ids: torch.Tensor,
    unit_embeddings: torch.Tensor,
    *,
    metric: BranchMetric = "semantic_entropy",
    entropy_mode: EntropyMode = "topk_logprobs",
    full_entropy: torch.Tensor | None = None,
    sd_mode: SDMode = "rose",
    sd_top_k: int = 20,
    generator: torch.Generator | None = None,
    sampled: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Score every position as a branch point; the tree rollout branches at the argmax.

    Args:
        top_logprobs: (L, K) the K largest log-probs at each position, from the rollout engine,
            sorted descending.
        top_ids: (L, K) their token ids.
        unit_embeddings: (V, D) normalised input embeddings.
        metric: ``semantic_entropy`` = SD x H (ROSE), ``entropy`` = H (FR3E-style ablation),
            ``divergence`` = SD only, ``random`` = uniform scores.
        entropy_mode: ``topk_logprobs`` (ROSE's code) or ``full_vocab`` (the paper; needs
            ``full_entropy`` (L,)).
        sd_top_k: candidates used for SD (ROSE: 20).
        sampled: (ids, log-probs), each (L,), of the sampled tokens: with ``topk_logprobs``, a
            sampled token outside the top K adds its term to H (the ROSE code's 21st entry).
    Returns:
        (score, H, SD), each (L,).
    """
    if entropy_mode == "full_vocab":
        if full_entropy is None:
            raise ValueError("entropy_mode='full_vocab' needs full_entropy")
        entropy = full_entropy.float()
    elif entropy_mode == "topk_logprobs":
        entropy = topk_entropy(top_logprobs.float())
        if sampled is not None:
            ids, logprobs = sampled
            outside = ~(top_ids == ids[:, None]).any(-1)
            entropy = entropy - torch.where(outside, logprobs.float().exp() * logprobs.float(), 0.0)
    else:
        raise ValueError(f"unknown entropy_mode '{entropy_mode}'")
    divergence = semantic_divergence(
        top_logprobs[..., :sd_top_k], top_ids[..., :sd_top_k], unit_embeddings, sd_mode
    )
    if metric == "semantic_entropy":
        score = divergence * entropy
    elif metric == "entropy":
        score = entropy
    elif metric == "divergence":
        score = divergence
    elif metric == "random":
        score = torch.rand(entropy.shape, generator=generator)
    else:
        raise ValueError(f"unknown branch metric '{metric}'")
    return score, entropy, divergence
