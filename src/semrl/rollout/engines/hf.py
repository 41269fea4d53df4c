"""Batched sampling with a KV cache, returning what RL needs per generated token.

A request is ``prompt_ids`` plus an optional ``prefix_ids`` (tokens of an existing response to
continue from, as tree rollouts do); only the newly generated tokens are returned. Each result has
the sampled ids, their log-probs, the top-k log-probs and ids at every position (ROSE's branching
scores need them), the full-vocabulary entropy, and whether it ended with EOS or was truncated.

A request may carry the ``PrefixCache`` of the chain it continues: then only the context tokens the
cache does not cover are encoded. With ``reuse_kv_cache=True`` every result carries the cache of all
tokens it fed through the model, ready for its own continuations. Finished rows leave the batch at
once, so a long straggler does not make the finished rows pay for its decoding steps.

Log-probs are those of the temperature-scaled distribution before top-p/top-k filtering, i.e. the
distribution the trainer's forward pass computes with the same temperature.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, cast

import torch
from transformers import PreTrainedModel

from semrl.core.entropy import entropy_from_logprobs
from semrl.core.watchdog import beat
from semrl.models.precision import autocast_to
from semrl.rollout.engines.base import (
    EngineCost,
    EnginePowers,
    Generation,
    GenerationRequest,
    KVHandle,
    OnDone,
    OnTokens,
    RequestRecord,
    SamplingParams,
    Tag,
    request_budget,
    require_power,
    sampling_time,
)
from semrl.rollout.engines.kv_cache import PrefixCache, batched_cache, last_logits, row_cache
from semrl.rollout.engines.row_loop import RowLoop
from semrl.rollout.seeds import draw_seed


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


class HFEngine:
    """Samples continuations from a causal LM with Hugging Face's KV cache (the ``hf`` engine)."""

    name = "hf"

    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_ids: list[int],
        pad_token_id: int,
        batch_size: int = 64,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.compute_dtype = compute_dtype or next(model.parameters()).dtype
        self.eos_token_ids = torch.tensor(sorted(set(eos_token_ids)))
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        self.cost = EngineCost()
        self.request_log: list[RequestRecord] | None = None
        self.sampled_by_prompt: Counter[tuple[int, ...]] | None = None
        self._prefills: list[int] = []  # context tokens each row of the last batch computed
        # a fork (a child continues its parent's PrefixCache) and the row loop on its model; no streaming
        self.powers = EnginePowers(fork=True, streaming=False, row_loop=True, computes_entropy=True)

    @property
    def generated_tokens(self) -> int:
        return self.cost.sampled_tokens

    def row_loop(self) -> RowLoop:
        """LATR's lookahead rows on the sampling model, padded with the tokenizer's pad token."""
        pad = self.pad_token_id if self.pad_token_id is not None else int(self.eos_token_ids.min())
        return RowLoop(self.model, self.compute_dtype, pad, self.cost, self.sampled_by_prompt)

    def release_kv(self, kv: KVHandle) -> None:
        """Nothing to do: a ``PrefixCache`` is freed with the last reference to it."""

    def generate_streaming(
        self,
        requests: list[tuple[Tag, GenerationRequest]],
        params: SamplingParams,
        stream_params: SamplingParams,
        generator: torch.Generator | None,
        on_done: OnDone[Tag],
        on_tokens: OnTokens[Tag],
        reuse_kv_cache: bool = False,
    ) -> None:
        """Not a power of this engine (``EnginePowers.streaming``): it samples in rounds."""
        require_power(self, "streaming", "streamed requests")

    def input_embeddings(self) -> torch.Tensor:
        """(V, D) input embeddings of the sampling model."""
        embeddings: Any = self.model.get_input_embeddings()
        return cast("torch.Tensor", embeddings.weight.detach())

    def release_memory(self) -> None:
        """Nothing to free: this engine keeps no cache between calls."""

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Copy a stream of full tensors into the sampling model (its full copy under FSDP), one at a
        time; without it there is nothing to do, since this engine samples from the trained model."""
        if weights is not None:
            from semrl.core.distributed import load_streamed

            load_streamed(self.model, weights)

    @torch.inference_mode()
    def generate(
        self,
        requests: list[GenerationRequest],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        reuse_kv_cache: bool = False,
        on_finished: Callable[[int], Any] | None = None,
    ) -> list[Generation]:
        out: list[Generation] = []
        # bf16 sampling over fp32 master weights
        with sampling_time(self.cost), autocast_to(self.compute_dtype, self.model):
            for start in range(0, len(requests), self.batch_size):
                chunk = requests[start : start + self.batch_size]
                submitted = self.cost.engine_steps
                out.extend(self._generate_batch(chunk, params, generator, reuse_kv_cache, on_finished))
                if self.request_log is not None:
                    self.request_log += [
                        RequestRecord(
                            start + i,
                            len(r.prompt_ids) + len(r.prefix_ids),
                            prefill,
                            len(g.token_ids),
                            submitted,
                            self.cost.engine_steps,
                        )
                        for i, (r, g, prefill) in enumerate(
                            zip(chunk, out[start:], self._prefills, strict=True)
                        )
                    ]
        self.cost.sampled_tokens += sum(len(g.token_ids) for g in out)
        self.cost.requests += len(requests)
        if self.sampled_by_prompt is not None:
            for request, generation in zip(requests, out, strict=True):
                self.sampled_by_prompt[tuple(request.prompt_ids)] += len(generation.token_ids)
        return out

    def generate_dynamic(
        self,
        requests: list[tuple[Tag, GenerationRequest]],
        params: SamplingParams,
        generator: torch.Generator | None,
        on_done: OnDone[Tag],
        reuse_kv_cache: bool = False,
    ) -> int:
        """``Engine.generate_dynamic`` in rounds: one batched ``generate`` per round, finished
        results handled in request order, the requests they return forming the next round."""
        calls = 0
        while requests:
            logged = len(self.request_log) if self.request_log is not None else 0
            outputs = self.generate([r for _, r in requests], params, generator, reuse_kv_cache)
            if self.request_log is not None:  # the tags in place of the batch indices
                self.request_log[logged:] = [
                    replace(record, tag=tag)
                    for record, (tag, _) in zip(self.request_log[logged:], requests, strict=True)
                ]
            calls += 1
            following: list[tuple[Tag, GenerationRequest]] = []
            for (tag, request), out in zip(requests, outputs, strict=True):
                following += on_done(tag, request, out)
            requests = following
        return calls

    # One of the two functions allowed past ruff's size limits (pyproject.toml): the decoding loop,
    # kept in one piece so that each step's cache, sampling and stop rules read in order.
    def _generate_batch(  # noqa: C901, PLR0912, PLR0915
        self,
        requests: list[GenerationRequest],
        params: SamplingParams,
        generator: torch.Generator | None,
        reuse_kv_cache: bool,
        on_finished: Callable[[int], Any] | None = None,
    ) -> list[Generation]:
        model = self.model
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        budgets = torch.tensor([request_budget(r, params) for r in requests])
        contexts = [r.prompt_ids + r.prefix_ids for r in requests]
        batch = len(contexts)

        # Row i = [left padding | cached[i] tokens from its PrefixCache | padding | uncached suffix].
        # The last context token is always fed, so that its logits give the first new token.
        own = [r.cache if isinstance(r.cache, PrefixCache) else None for r in requests]  # hf's copies only
        cached = [min(c.length, len(ctx) - 1) if c else 0 for c, ctx in zip(own, contexts, strict=True)]
        suffixes = [ctx[n:] for ctx, n in zip(contexts, cached, strict=True)]
        past_width, suffix_width = max(cached), max(len(s) for s in suffixes)
        input_ids = torch.full((batch, suffix_width), self.pad_token_id, dtype=torch.long)
        positions = torch.zeros((batch, suffix_width), dtype=torch.long)
        attention = torch.zeros((batch, past_width + suffix_width), dtype=torch.long)
        for i, (n, suffix) in enumerate(zip(cached, suffixes, strict=True)):
            input_ids[i, suffix_width - len(suffix) :] = torch.tensor(suffix)
            positions[i, suffix_width - len(suffix) :] = torch.arange(n, n + len(suffix))
            attention[i, past_width - n : past_width] = 1
            attention[i, past_width + suffix_width - len(suffix) :] = 1
        cache = batched_cache(own, cached, device)
        attention = attention.to(device)
        self._prefills = [len(s) for s in suffixes]
        self.cost.prefill_tokens += sum(self._prefills)
        self.cost.engine_steps += 1
        self.cost.running_rows += batch
        logits = last_logits(model, input_ids.to(device), attention, positions.to(device), cache)

        max_steps = int(budgets.max().item())
        k = params.logprobs_top_k
        tokens = torch.full((batch, max_steps), self.pad_token_id, dtype=torch.long)
        logps = torch.zeros((batch, max_steps))
        top_lps = torch.zeros((batch, max_steps, k))
        top_ids = torch.zeros((batch, max_steps, k), dtype=torch.long)
        entropies = torch.zeros((batch, max_steps))
        lengths = torch.zeros(batch, dtype=torch.long)
        finished = torch.zeros(batch, dtype=torch.bool)
        caches: list[PrefixCache | None] = [None] * batch
        active = torch.arange(batch)  # original row index of each row still in the batch
        next_pos = torch.tensor([len(c) for c in contexts], device=device)
        eos = self.eos_token_ids.to(device)
        if generator is not None and generator.device != torch.device(device):
            # sampling runs on the model's device: a device stream seeded from the caller's CPU stream
            seed = draw_seed(generator)
            generator = torch.Generator(device).manual_seed(seed)
        row_generators = None
        if any(r.seed is not None for r in requests):
            if not all(r.seed is not None for r in requests):
                raise ValueError("either every request of a batch has a seed or none has")
            seeds = [int(r.seed) for r in requests if r.seed is not None]
            row_generators = [torch.Generator(device).manual_seed(seed) for seed in seeds]
        for step in range(max_steps):
            beat()
            scaled = logits / params.temperature if params.temperature > 0 else logits
            logp_all = torch.log_softmax(scaled, dim=-1)
            if params.temperature > 0:
                probs = torch.softmax(filter_logits(scaled, params.top_k, params.top_p), dim=-1)
                if row_generators is None:
                    token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
                else:
                    token = torch.cat(
                        [
                            torch.multinomial(probs[j], 1, generator=row_generators[int(row)])
                            for j, row in enumerate(active.tolist())
                        ]
                    )
            else:
                token = scaled.argmax(-1)
            top_lp, top_id = torch.topk(logp_all, k, dim=-1)
            tokens[active, step] = token.cpu()
            logps[active, step] = logp_all.gather(-1, token[:, None]).squeeze(-1).cpu()
            top_lps[active, step] = top_lp.cpu()
            top_ids[active, step] = top_id.cpu()
            entropies[active, step] = entropy_from_logprobs(logp_all).cpu()
            lengths[active] += 1
            is_eos = torch.isin(token, eos).cpu()
            finished[active] |= is_eos
            done = is_eos | (lengths[active] >= budgets[active])
            if on_finished is not None and (count := int(done.sum())):
                on_finished(count)
            if bool(done.any()):
                if reuse_kv_cache:
                    for row in done.nonzero().flatten().tolist():
                        if requests[int(active[row])].keep_kv:  # a leaf's copy would never be read
                            caches[int(active[row])] = row_cache(cache, row, attention[row])
                keep = (~done).nonzero().flatten()
                if keep.numel() == 0:
                    break
                active, token = active[keep], token[keep]
                next_pos, attention = next_pos[keep], attention[keep]
                # Drop finished rows, then the leading columns that only they used.
                first = int(attention.argmax(-1).min().item())
                layers: list[Any] = list(cache.layers)
                for layer in layers:
                    layer.keys = layer.keys[keep.to(device), :, first:]
                    layer.values = layer.values[keep.to(device), :, first:]
                attention = attention[:, first:]
            attention = torch.cat([attention, attention.new_ones((len(active), 1))], -1)
            self.cost.engine_steps += 1
            self.cost.running_rows += len(active)
            logits = last_logits(model, token[:, None], attention, next_pos[:, None], cache)
            next_pos = next_pos + 1
        if was_training:
            model.train()

        results = []
        for i in range(batch):
            n = int(lengths[i])
            results.append(
                Generation(
                    token_ids=tokens[i, :n].clone(),
                    logprobs=logps[i, :n].clone(),
                    top_logprobs=top_lps[i, :n].clone(),
                    top_ids=top_ids[i, :n].clone(),
                    entropy=entropies[i, :n].clone(),
                    finished=bool(finished[i]),
                    cache=caches[i],
                )
            )
        return results
