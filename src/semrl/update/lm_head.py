"""Log-probs and entropies of given tokens from last hidden states and the LM head, a bounded
number of rows at a time, so that the full (tokens x vocabulary) logits never exist at once.

The logits of a chunk of rows are computed, reduced to log-probs of the targets and entropies (both
with gradient), and dropped; backward recomputes them chunk by chunk. Peak memory beyond the
inputs and gradients is two (chunk_size x V) fp32 buffers, whatever the micro-batch size
(docs/training.md "Memory at the papers' scale").
"""

from __future__ import annotations

from typing import Any

import torch

from semrl.core.entropy import entropy_from_logprobs
from semrl.models.precision import active_dtype

DEFAULT_LOGITS_CHUNK = 256  # trainer.logits_chunk_size's default


def _chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """(c, H) hidden in the compute dtype, (V, H) weight -> (c, V) fp32 logits / temperature."""
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    logits = logits.float()
    return logits / temperature if temperature != 1.0 else logits


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
        compute_dtype: torch.dtype,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = hidden.shape[0]
        w = weight.to(compute_dtype)
        b = None if bias is None else bias.to(compute_dtype)
        logp = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        entropy = torch.zeros(rows if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for start in range(0, rows, chunk_size):
            end = min(start + chunk_size, rows)
            logits = _chunk_logits(hidden[start:end].to(compute_dtype), w, b, temperature)
            chunk_lse = torch.logsumexp(logits, dim=-1)
            lse[start:end] = chunk_lse
            logp[start:end] = logits.gather(-1, targets[start:end, None]).squeeze(-1) - chunk_lse
            if with_entropy:
                logits -= chunk_lse[:, None]  # log p, in place
                entropy[start:end] = entropy_from_logprobs(logits)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature, ctx.chunk_size, ctx.compute_dtype = temperature, chunk_size, compute_dtype
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor, grad_entropy: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        # the entropy's gradient only when a loss reads it (the entropy bonus, algorithm.entropy_coeff)
        with_entropy = entropy.numel() > 0 and bool(grad_entropy.any())
        temperature, chunk_size, cdtype = ctx.temperature, ctx.chunk_size, ctx.compute_dtype
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        w = weight.to(cdtype)
        b = None if bias is None else bias.to(cdtype)
        grad_hidden = torch.zeros_like(hidden) if need_h else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        for start in range(0, hidden.shape[0], chunk_size):
            end = min(start + chunk_size, hidden.shape[0])
            g = grad_logp[start:end].float()
            gh = grad_entropy[start:end].float() if with_entropy else None
            if not bool(g.any()) and (gh is None or not bool(gh.any())):  # padding, tokens outside the loss
                continue
            h = hidden[start:end].to(cdtype)
            logits = _chunk_logits(h, w, b, temperature)
            # d logp_t / d z = onehot(target) - softmax(z); d H / d z = -p (log p + H); then / temperature
            if gh is None:
                # Computed in place in the logits' buffer, so that a chunk holds one vocabulary-wide tensor.
                grad_logits = logits.sub_(lse[start:end, None]).exp_().mul_(-g[:, None])
            else:
                log_p = logits.sub_(lse[start:end, None])
                p = torch.exp(log_p)
                coef = log_p.add_(entropy[start:end, None]).mul_(gh[:, None]).add_(g[:, None])
                grad_logits = coef.mul_(p).neg_()
            grad_logits.scatter_add_(-1, targets[start:end, None], g[:, None])
            if temperature != 1.0:
                grad_logits.div_(temperature)
            grad_logits = grad_logits.to(cdtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = (grad_logits @ w).to(hidden.dtype)
            if grad_weight is not None:
                if cdtype == torch.float32:
                    grad_weight.addmm_(grad_logits.T, h)
                else:  # a low-precision matmul, summed over chunks in fp32
                    grad_weight.add_(grad_logits.T @ h)
            if grad_bias is not None:
                grad_bias.add_(grad_logits.float().sum(0))
        return (
            grad_hidden,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_size: int = DEFAULT_LOGITS_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of ``targets`` and entropies of the next-token distributions.

    Args:
        hidden: (M, H) last hidden states (after the final norm) of the positions that predict the
            targets.
        weight: (V, H) the LM head; ``bias`` (V,) if it has one.
        targets: (M,) token ids.
        temperature: the logits are divided by it (the sampling temperature).
        with_entropy: also return the entropies, differentiable like the log-probs (the entropy bonus's
            gradient; a loss that reads them detached adds no work to backward).
        chunk_size: rows whose logits exist at once; besides the gradients, peak extra memory
            is about 2 x chunk_size x V x 4 bytes.

    Returns:
        (M,) fp32 log-probs and (M,) fp32 entropies (or None), both differentiable in ``hidden``,
        ``weight`` and ``bias``. The logits are computed in the autocast dtype when autocast is on (as
        the model's own LM head would be), else in ``hidden``'s dtype; softmax is always fp32.
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1] or weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"chunked_logprobs needs hidden (M, H), weight (V, H), targets (M,); got {tuple(hidden.shape)}, "
            f"{tuple(weight.shape)}, {tuple(targets.shape)}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    compute_dtype = active_dtype(hidden)
    with torch.autocast(hidden.device.type, enabled=False):
        # torch.autograd.Function.apply is untyped
        logp, entropy = _ChunkedLogprobs.apply(  # type: ignore[no-untyped-call]
            hidden,
            weight,
            bias,
            targets,
            temperature if temperature > 0 else 1.0,
            chunk_size,
            compute_dtype,
            with_entropy,
        )
    return logp, entropy if with_entropy else None
