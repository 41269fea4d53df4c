"""LATR's lookahead rows on the sampling model (``Engine.row_loop``; docs/methods/latr.md, "On the
engines"): one batched KV cache whose rows are copied at a fork and dropped when pruned, as the
official code does on the transformers side."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from semrl.core.watchdog import beat
from semrl.models.precision import autocast_to
from semrl.rollout.engines.base import EngineCost, sampling_time
from semrl.rollout.engines.kv_cache import PrefixCache, last_logits, row_cache


class RowLoop:
    """Rows that take one token per forward through one batched KV cache, where a row can be copied (a
    fork shares its parent's KV) or dropped between forwards: LATR's lookahead, as its official code
    duplicates KV rows (docs/methods/latr.md, "On the engines"). Every forward is counted in ``cost``.

    ``start`` -> (``top2`` -> ``select`` -> ``feed``)*; ``row_cache`` hands a row's KV to the engine.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        compute_dtype: torch.dtype,
        pad_token_id: int,
        cost: EngineCost,
        sampled_by_prompt: Counter[tuple[int, ...]] | None = None,
        reuse_kv_cache: bool = True,
    ) -> None:
        """``reuse_kv_cache``: ``row_cache`` gives a row's KV, which the engine continues (hf); False where
        the engine keeps KV of its own kind (vllm, which samples beside this model)."""
        self.reuse_kv_cache = reuse_kv_cache
        self.model, self.compute_dtype, self.pad_token_id = model, compute_dtype, pad_token_id
        self.cost, self.sampled_by_prompt = cost, sampled_by_prompt
        self.row_prompts: list[tuple[int, ...]] = []  # each row's prompt, for ``sampled_by_prompt``
        self.device = next(model.parameters()).device
        self.cache = DynamicCache()
        self.attention = torch.zeros((0, 0), dtype=torch.long)
        self.next_pos = torch.zeros(0, dtype=torch.long)
        self.logits = torch.zeros(0, 0)

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        was_training = self.model.training
        self.model.eval()
        with sampling_time(self.cost), torch.inference_mode(), autocast_to(self.compute_dtype, self.model):
            ids, attention = input_ids.to(self.device), self.attention.to(self.device)
            self.logits = last_logits(self.model, ids, attention, positions.to(self.device), self.cache).cpu()
        if was_training:
            self.model.train()
        self.cost.engine_steps += 1
        self.cost.running_rows += len(input_ids)
        beat()

    def start(self, contexts: list[list[int]]) -> None:
        """Encode every row's context, its prompt (left-padded), ready for its first token."""
        self.row_prompts = [tuple(c) for c in contexts]
        width = max(len(c) for c in contexts)
        input_ids = torch.full((len(contexts), width), self.pad_token_id, dtype=torch.long)
        positions = torch.zeros((len(contexts), width), dtype=torch.long)
        self.attention = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, context in enumerate(contexts):
            input_ids[i, width - len(context) :] = torch.tensor(context)
            positions[i, width - len(context) :] = torch.arange(len(context))
            self.attention[i, width - len(context) :] = 1
        self.cache = DynamicCache()
        self._forward(input_ids, positions)
        self.next_pos = torch.tensor([len(c) for c in contexts])
        self.cost.prefill_tokens += sum(len(c) for c in contexts)
        self.cost.requests += len(contexts)

    def top2(self) -> tuple[list[tuple[int, int]], list[tuple[float, float]]]:
        """Per row, the two most likely next tokens of the raw distribution (temperature 1, no
        filtering) and their log-probs; each row's next token is one of them (a sampled token)."""
        values, ids = torch.topk(torch.log_softmax(self.logits, dim=-1), 2, dim=-1)
        self.cost.sampled_tokens += len(ids)
        if self.sampled_by_prompt is not None:
            self.sampled_by_prompt.update(self.row_prompts)
        return [(a, b) for a, b in ids.tolist()], [(a, b) for a, b in values.tolist()]

    def select(self, rows: list[int]) -> None:
        """Keep ``rows`` (indices of the current rows, repeats allowed: a copy) in this order."""
        index = torch.tensor(rows, dtype=torch.long)
        self.row_prompts = [self.row_prompts[i] for i in rows]
        self.attention, self.next_pos = self.attention[index], self.next_pos[index]
        self.logits = self.logits[index]
        # the leading columns that only dropped rows used
        first = int(self.attention.argmax(-1).min().item()) if len(rows) else 0
        self.attention = self.attention[:, first:]
        layers: list[Any] = list(self.cache.layers)
        for layer in layers:
            layer.keys = layer.keys[index.to(self.device), :, first:]
            layer.values = layer.values[index.to(self.device), :, first:]

    def feed(self, tokens: list[int]) -> None:
        """Feed each row its next token."""
        self.attention = torch.cat([self.attention, self.attention.new_ones((len(tokens), 1))], -1)
        self._forward(torch.tensor(tokens)[:, None], self.next_pos[:, None])
        self.next_pos = self.next_pos + 1

    def row_cache(self, row: int) -> PrefixCache | None:
        """Row ``row``'s KV of every token fed so far, unpadded; None when its engine cannot continue
        it (``reuse_kv_cache``)."""
        return row_cache(self.cache, row, self.attention[row]) if self.reuse_kv_cache else None
