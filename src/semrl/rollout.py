"""Batched sampling with a KV cache, returning what RL needs per generated token.

A request is ``prompt_ids`` plus an optional ``prefix_ids`` (tokens of an existing response to
continue from, as tree rollouts do); only the newly generated tokens are returned. Each result has
the sampled ids, their log-probs, the top-k log-probs and ids at every position (ROSE's branching
scores need them), the full-vocabulary entropy, and whether it ended with EOS or was truncated.

Log-probs are those of the temperature-scaled distribution before top-p/top-k filtering, i.e. the
distribution the trainer's forward pass computes with the same temperature.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    logprobs_top_k: int = 20


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    prefix_ids: list[int] = field(default_factory=list)
    max_new_tokens: int | None = None  # overrides SamplingParams.max_new_tokens (branch budgets)


@dataclass
class Generation:
    """One sampled continuation; tensors have length L = number of new tokens.

    Attributes:
        token_ids: (L,) new tokens, including the final EOS if there is one.
        logprobs: (L,) log-prob of each sampled token.
        top_logprobs: (L, k) largest log-probs at each position, descending.
        top_ids: (L, k) their token ids.
        entropy: (L,) entropy of the full next-token distribution.
        finished: ended with EOS.
        truncated: stopped by the token budget.
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    top_logprobs: torch.Tensor
    top_ids: torch.Tensor
    entropy: torch.Tensor
    finished: bool

    @property
    def truncated(self) -> bool:
        return not self.finished


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus to -inf. logits: (B, V)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # remove tokens once the mass *before* them already exceeds top_p (keeps at least one)
        remove_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) > top_p
        remove = torch.zeros_like(remove_sorted).scatter(-1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


class RolloutEngine:
    """Samples continuations from a causal LM with Hugging Face's KV cache."""

    def __init__(
        self, model: PreTrainedModel, eos_token_ids: list[int], pad_token_id: int, batch_size: int = 64
    ) -> None:
        self.model = model
        self.eos_token_ids = torch.tensor(sorted(set(eos_token_ids)))
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size

    @torch.inference_mode()
    def generate(
        self,
        requests: list[GenerationRequest],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        out: list[Generation] = []
        for start in range(0, len(requests), self.batch_size):
            out.extend(self._generate_batch(requests[start : start + self.batch_size], params, generator))
        return out

    def _generate_batch(
        self, requests: list[GenerationRequest], params: SamplingParams, generator: torch.Generator | None
    ) -> list[Generation]:
        model = self.model
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        contexts = [r.prompt_ids + r.prefix_ids for r in requests]
        budgets = torch.tensor(
            [r.max_new_tokens if r.max_new_tokens is not None else params.max_new_tokens for r in requests]
        )
        batch, width = len(contexts), max(len(c) for c in contexts)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for i, ctx in enumerate(contexts):  # left padding: every row's next token is at column `width`
            input_ids[i, width - len(ctx) :] = torch.tensor(ctx)
            attention[i, width - len(ctx) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        input_ids, attention, positions = input_ids.to(device), attention.to(device), positions.to(device)
        eos = self.eos_token_ids.to(device)
        k = params.logprobs_top_k

        cache = DynamicCache()
        logits = model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions,
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        ).logits[:, -1, :].float()
        next_pos = positions[:, -1] + 1
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        steps: list[tuple[torch.Tensor, ...]] = []
        max_steps = int(budgets.max().item())
        budgets = budgets.to(device)
        for step in range(max_steps):
            scaled = logits / params.temperature if params.temperature > 0 else logits
            logp_all = torch.log_softmax(scaled, dim=-1)
            if params.temperature > 0:
                probs = torch.softmax(filter_logits(scaled, params.top_k, params.top_p), dim=-1)
                token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            else:
                token = scaled.argmax(-1)
            token = torch.where(done, torch.full_like(token, self.pad_token_id), token)
            token_logp = logp_all.gather(-1, token[:, None]).squeeze(-1)
            top_lp, top_id = torch.topk(logp_all, k, dim=-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            steps.append((token, token_logp, top_lp, top_id, entropy, done.clone()))
            is_eos = torch.isin(token, eos) & ~done
            finished |= is_eos
            done |= is_eos | (step + 1 >= budgets)
            if bool(done.all()):
                break
            attention = torch.cat([attention, torch.ones((batch, 1), dtype=attention.dtype, device=device)], -1)
            logits = model(
                input_ids=token[:, None], attention_mask=attention, position_ids=next_pos[:, None],
                past_key_values=cache, use_cache=True,
            ).logits[:, -1, :].float()
            next_pos = next_pos + 1
        if was_training:
            model.train()

        tokens, logps, top_lps, top_ids, entropies, was_done = (torch.stack(x, 1).cpu() for x in zip(*steps, strict=False))
        results = []
        for i in range(batch):
            n = int((~was_done[i]).sum().item())
            results.append(
                Generation(
                    token_ids=tokens[i, :n].clone(),
                    logprobs=logps[i, :n].clone(),
                    top_logprobs=top_lps[i, :n].clone(),
                    top_ids=top_ids[i, :n].clone(),
                    entropy=entropies[i, :n].clone(),
                    finished=bool(finished[i].item()),
                )
            )
        return results
