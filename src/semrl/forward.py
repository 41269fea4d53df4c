"""The training forward pass: per-token log-probs and entropies of response tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch
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
    model: PreTrainedModel, batch: SequenceBatch, temperature: float = 1.0, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (N, R) of the response tokens and, optionally, the entropy (N, R) of the full
    next-token distribution (no gradient through the entropy). Padding positions hold 0.

    Only the R+1 last positions go through the LM head, so prompt tokens cost no vocab projection.
    """
    device = next(model.parameters()).device
    ids = batch.input_ids.to(device)
    att = batch.attention_mask.to(device)
    positions = (att.cumsum(-1) - 1).clamp(min=0)
    r = batch.response_mask.shape[1]
    logits = model(
        input_ids=ids, attention_mask=att, position_ids=positions, use_cache=False,
        logits_to_keep=r + 1,
    ).logits[:, :-1, :]
    return token_logprobs(logits, ids[:, batch.prompt_width :], batch.response_mask.to(device), temperature, with_entropy)


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, R, V) logits predicting (N, R) targets -> (N, R) log-probs of the targets and optionally
    the entropy of each next-token distribution (no gradient); both 0 where ``mask`` is 0."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1) * mask
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
    return logp, entropy
