"""A batch's prompt+response token ids as the padded tensors every forward pass reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
