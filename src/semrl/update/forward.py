"""The training forward pass: per-token log-probs and entropies of response tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from semrl.rollout.sequences import SequenceBatch
from semrl.update.lm_head import DEFAULT_LOGITS_CHUNK, chunked_logprobs

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def response_logprobs(
    model: PreTrainedModel,
    batch: SequenceBatch,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_size: int = DEFAULT_LOGITS_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (N, R) of the response tokens and, optionally, the entropy (N, R) of the full
    next-token distribution (differentiable, for the entropy bonus). Padding positions hold 0.

    Only response tokens go through the LM head, ``chunk_size`` of them at a time (``semrl.update.lm_head``).
    """
    device = next(model.parameters()).device
    ids = batch.input_ids.to(device)
    att = batch.attention_mask.to(device)
    positions = (att.cumsum(-1) - 1).clamp(min=0)
    p, r = batch.prompt_width, batch.response_mask.shape[1]
    hidden = final_hidden_states(model, input_ids=ids, attention_mask=att, position_ids=positions)
    # the hidden state of column c predicts token c + 1
    return head_logprobs(
        model,
        hidden[:, p - 1 : p + r - 1],
        ids[:, p:],
        batch.response_mask.to(device),
        temperature,
        with_entropy,
        chunk_size,
    )


def final_hidden_states(model: PreTrainedModel, **inputs: Any) -> torch.Tensor:
    """(B, S, H) hidden states after the final norm, from the model's own forward with the LM head
    applied to no position. Calling the model itself (not ``model.model``) lets FSDP's root hooks
    gather and free the parameters as in any forward."""
    captured: list[torch.Tensor] = []

    def keep(_module: torch.nn.Module, _args: tuple[Any, ...], output: Any) -> None:
        captured.append(output[0])  # last_hidden_state

    handle = model.base_model.register_forward_hook(keep)
    try:
        no_position = torch.empty(0, dtype=torch.long, device=inputs["input_ids"].device)
        model(**inputs, use_cache=False, logits_to_keep=no_position)
    finally:
        handle.remove()
    return captured[-1]


# config attributes of models whose logits are more than ``hidden @ lm_head.weight.T (+ bias)``
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def lm_head_parameters(model: PreTrainedModel) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The LM head's (V, H) weight and (V,) bias or None. Under FSDP call it after the forward: the
    head's parameters are then gathered."""
    head = model.get_output_embeddings()
    transforms = [k for k in _LOGIT_TRANSFORMS if getattr(model.config, k, None) not in (None, 1.0)]
    if not isinstance(head, torch.nn.Linear) or transforms:
        why = f"transforms its logits ({', '.join(transforms)})" if transforms else "has no linear LM head"
        raise ValueError(
            "semrl computes log-probs from the LM head's weight, "
            f"but model type '{model.config.model_type}' {why}; "
            "this model is not supported for training"
        )
    return head.weight, head.bias


def head_logprobs(
    model: PreTrainedModel,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_size: int = DEFAULT_LOGITS_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, R, H) hidden states predicting (N, R) targets -> (N, R) fp32 log-probs of the targets and
    optionally entropies (no gradient); both 0 where ``mask`` is 0, and only masked-in tokens go
    through the LM head."""
    weight, bias = lm_head_parameters(model)
    keep = mask.bool()
    logp_kept, entropy_kept = chunked_logprobs(
        hidden[keep],
        weight,
        targets[keep],
        bias=bias,
        temperature=temperature,
        with_entropy=with_entropy,
        chunk_size=chunk_size,
    )
    logp = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    logp[keep] = logp_kept
    entropy = None
    if entropy_kept is not None:
        entropy = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
        entropy[keep] = entropy_kept
    return logp, entropy
