"""The training forward pass: per-token log-probs and entropies of response tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from semrl.lm_head import DEFAULT_LOGITS_CHUNK, chunked_logprobs

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class SequenceBatch:
    """Prompt+response pairs laid out as ``[left-padded prompt | right-padded response]``.

    All responses start at column P, so the logits of columns P-1 .. P+R-2 predict them.

    Attributes:
        input_ids: (N, P + R).
        attention_mask: (N, P + R), 1 on real tokens.
        response_mask: (N, R), 1 on response tokens.
        prompt_width: P.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    prompt_width: int

    @property
    def responses(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_width :]

    def select(self, index: torch.Tensor | list[int]) -> SequenceBatch:
        """Rows ``index`` with columns trimmed to what those rows use."""
        ids, att, resp = self.input_ids[index], self.attention_mask[index], self.response_mask[index]
        used_prompt = att[:, : self.prompt_width].any(0).nonzero()
        first = int(used_prompt[0].item()) if used_prompt.numel() else self.prompt_width
        used_resp = resp.any(0).nonzero()
        r = int(used_resp[-1].item()) + 1 if used_resp.numel() else 0
        end = self.prompt_width + r
        return SequenceBatch(ids[:, first:end], att[:, first:end], resp[:, :r], self.prompt_width - first)


def make_sequence_batch(
    prompts: list[list[int]], responses: list[list[int]], pad_token_id: int
) -> SequenceBatch:
    n = len(prompts)
    p_width = max(len(p) for p in prompts)
    r_width = max(1, max(len(r) for r in responses))
    ids = torch.full((n, p_width + r_width), pad_token_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    resp = torch.zeros((n, r_width), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[i, p_width - len(p) : p_width] = torch.tensor(p, dtype=torch.long)
        att[i, p_width - len(p) : p_width] = 1
        if r:
            ids[i, p_width : p_width + len(r)] = torch.tensor(r, dtype=torch.long)
            att[i, p_width : p_width + len(r)] = 1
            resp[i, : len(r)] = 1
    return SequenceBatch(ids, att, resp, p_width)


def response_logprobs(
    model: PreTrainedModel,
    batch: SequenceBatch,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_size: int = DEFAULT_LOGITS_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (N, R) of the response tokens and, optionally, the entropy (N, R) of the full
    next-token distribution (differentiable, for the entropy bonus). Padding positions hold 0.

    Only response tokens go through the LM head, ``chunk_size`` of them at a time (``semrl.lm_head``).
    """
    device = next(model.parameters()).device
    ids = batch.input_ids.to(device)
    att = batch.attention_mask.to(device)
    positions = (att.cumsum(-1) - 1).clamp(min=0)
    p, r = batch.prompt_width, batch.response_mask.shape[1]
    hidden = final_hidden_states(model, input_ids=ids, attention_mask=att, position_ids=positions)
    # the hidden state of column c predicts token c + 1
    return head_logprobs(
        model, hidden[:, p - 1 : p + r - 1], ids[:, p:], batch.response_mask.to(device), temperature,
        with_entropy, chunk_size,
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
        hidden[keep], weight, targets[keep], bias=bias, temperature=temperature, with_entropy=with_entropy,
        chunk_size=chunk_size,
    )
    logp = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    logp[keep] = logp_kept
    entropy = None
    if entropy_kept is not None:
        entropy = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
        entropy[keep] = entropy_kept
    return logp, entropy
