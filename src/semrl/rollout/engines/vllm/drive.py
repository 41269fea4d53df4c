"""One call of the vllm engine (``generate``, ``generate_dynamic`` or ``generate_streaming``): the loop
``LLM.generate`` runs, with the engine's callbacks inside it (docs/engines.md).

The call adds requests, steps the engine, hands each finished request to ``on_done`` and each streamed
request's new tokens to ``on_tokens``, and adds what they return in the same iteration, so no request
waits for another's round. It counts the cost: the context tokens each request computed
(``len(context) - num_cached_tokens``, when its first output comes), the engine steps and the
sequences in each. The fork's state changes only through ``ForkHooks``' verbs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Generic, Protocol

import torch

from semrl.core.watchdog import beat
from semrl.errors import EngineError
from semrl.rollout.engines.base import (
    EngineCost,
    Generation,
    GenerationRequest,
    OnDone,
    OnTokens,
    RequestRecord,
    SamplingParams,
    Tag,
    request_budget,
)
from semrl.rollout.engines.vllm import state
from semrl.rollout.engines.vllm.entropy import ENTROPY_KEY, forget, take
from semrl.rollout.engines.vllm.fork import ForkHooks
from semrl.rollout.engines.vllm.start import VLLMSettings
from semrl.rollout.seeds import draw_seed


class _Engine(Protocol):
    """What a call reads of its engine (``VLLMEngine``)."""

    llm: Any
    vllm: Any
    settings: VLLMSettings
    eos_token_ids: list[int]
    cost: EngineCost
    forks: ForkHooks | None
    request_log: list[RequestRecord] | None
    sampled_by_prompt: Counter[tuple[int, ...]] | None


def scheduler_of(core: Any) -> Any:
    """The scheduler of an in-process engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), whose
    ``running`` list gives the running batch; None where this vLLM keeps it elsewhere."""
    return getattr(getattr(getattr(core, "engine_core", None), "engine_core", None), "scheduler", None)


@dataclass
class _Running(Generic[Tag]):
    """A request in a call: its tag, what it asked, its context length, the engine step it entered at,
    its sampler, and what it cost so far."""

    tag: Tag
    request: GenerationRequest
    context: int
    submitted: int
    params: SamplingParams
    prefill: int | None = None  # known from its first output
    sampled: int = 0


class EngineCall(Generic[Tag]):
    """One call's requests, from their admission to their end, in the order vLLM runs them.

    Args:
        streaming: the streamed requests' sampler and ``on_tokens`` (``generate_streaming``), or None.
        reuse_kv_cache: with the fork power, each finished request's blocks are held for its children (and a
            stream's while it runs) until released or the call ends.
    """

    def __init__(
        self,
        engine: _Engine,
        params: SamplingParams,
        generator: torch.Generator | None,
        on_done: OnDone[Tag],
        streaming: tuple[SamplingParams, OnTokens[Tag]] | None,
        reuse_kv_cache: bool,
    ) -> None:
        self.engine = engine
        self.cost = engine.cost
        self.core = engine.llm.llm_engine
        self.scheduler = scheduler_of(self.core)
        self.forks = engine.forks
        self.params, self.generator, self.on_done = params, generator, on_done
        self.streaming, self.reuse_kv_cache = streaming, reuse_kv_cache
        self.running: dict[str, _Running[Tag]] = {}
        self.by_tag: dict[Tag, str] = {}  # streamed requests' ids, for stopping them

    def run(self, requests: list[tuple[Tag, GenerationRequest]]) -> None:
        """Sample ``requests`` and all that the callbacks add, until none runs."""
        if self.forks is not None:
            self.forks.start_call()
        try:
            self.submit(requests)
            while self.running:
                self.step()
        except BaseException:
            # a callback (or the engine) raised: the requests still running must not hold blocks and
            # slots into the next call, whose steps would drop their outputs
            if self.running:
                self.core.abort_request(list(self.running))
            raise
        finally:
            forget(list(self.running))
            if self.forks is not None:  # no hold outlives its call
                forked, fallbacks, refused = self.forks.end_call()
                self.cost.forked_requests += forked
                self.cost.fork_fallbacks += fallbacks
                self.cost.holds_refused += refused

    def submit(self, pairs: list[tuple[Tag, GenerationRequest]]) -> None:
        """Add tagged requests to the running batch."""
        for tag, request in pairs:
            sampler = self.streaming[0] if request.stream and self.streaming is not None else self.params
            request_id, prompt, sampling = self._prepare(request, sampler)
            if self.forks is not None:
                self.forks.mark(request_id, request, self.reuse_kv_cache)
            self.core.add_request(request_id, prompt, sampling)
            context = len(prompt["prompt_token_ids"])
            self.running[request_id] = _Running(tag, request, context, self.cost.engine_steps, sampler)
            if request.stream:
                self.by_tag[tag] = request_id
        self.cost.requests += len(pairs)

    def step(self) -> None:
        """One engine step: its outputs to their callbacks, and what those return into the batch."""
        outputs = self.core.step()
        beat()
        if self.forks is not None:
            self.forks.after_step(bool(outputs))
        self.cost.engine_steps += 1
        # the step ran the sequences still running after it and those it finished
        still_running = len(self.scheduler.running) if self.scheduler is not None else 0
        self.cost.running_rows += still_running + sum(1 for out in outputs if out.finished)
        pieces: list[tuple[Tag, Generation]] = []
        for out in outputs:
            entry = self.running.get(out.request_id)
            if entry is not None:  # None: a stream stopped in this step's callback
                self._output(entry, out, pieces)
        if self.streaming is not None and pieces:
            self._stream(pieces)

    def _output(self, entry: _Running[Tag], out: Any, pieces: list[tuple[Tag, Generation]]) -> None:
        """A request's output of this step: a finished request goes to ``on_done``, a stream's new
        tokens to ``pieces``."""
        generation = self._to_generation(out.outputs[0], entry.params.logprobs_top_k)
        if entry.request.entropy and out.finished:
            generation.entropy = take(out.request_id, len(generation.token_ids))
        if self.forks is not None:
            running_stream = self.reuse_kv_cache and entry.request.stream
            generation.cache = self.forks.handle(out.request_id, out.finished, running_stream)
        self._settle(entry, out, generation)
        if out.finished:
            del self.running[out.request_id]
            self._log(entry)
        if entry.request.stream:
            pieces.append((entry.tag, generation))
            if out.finished:
                del self.by_tag[entry.tag]
        elif out.finished:
            self.submit(self.on_done(entry.tag, entry.request, generation))

    def _stream(self, pieces: list[tuple[Tag, Generation]]) -> None:
        """Hand the streamed requests' new tokens to ``on_tokens``; stop the streams it names and
        start the requests it returns."""
        assert self.streaming is not None
        started, stopped = self.streaming[1](pieces)
        if stopped:
            ids = [self.by_tag.pop(tag) for tag in stopped if tag in self.by_tag]
            self.core.abort_request(ids)
            for request_id in ids:
                self._log(self.running.pop(request_id))
        self.submit(started)

    def _settle(self, entry: _Running[Tag], out: Any, generation: Generation) -> None:
        """Count an output's cost: its context computed (at the first output) and its new tokens."""
        if entry.prefill is None:
            entry.prefill = entry.context - (out.num_cached_tokens or 0)
            self.cost.prefill_tokens += entry.prefill
        entry.sampled += len(generation.token_ids)
        if self.engine.sampled_by_prompt is not None:
            self.engine.sampled_by_prompt[tuple(entry.request.prompt_ids)] += len(generation.token_ids)

    def _log(self, entry: _Running[Tag]) -> None:
        """A request's record, when the engine keeps a request log."""
        if self.engine.request_log is not None:
            steps = self.cost.engine_steps
            record = RequestRecord(
                entry.tag, entry.context, entry.prefill or 0, entry.sampled, entry.submitted, steps
            )
            self.engine.request_log.append(record)

    def _prepare(self, request: GenerationRequest, params: SamplingParams) -> tuple[str, Any, Any]:
        """A new request id, vLLM's token prompt and its sampling parameters."""
        engine, vllm = self.engine, self.engine.vllm
        request_id = f"semrl-{next(state.REQUEST_IDS)}"
        budget = request_budget(request, params, self.streaming is not None)
        context = request.prompt_ids + request.prefix_ids
        if len(context) + budget > engine.settings.max_model_len:
            raise ValueError(
                f"a request of {len(context)} context + {budget} new tokens exceeds the vllm engine's "
                f"max_model_len {engine.settings.max_model_len} (data.max_prompt_length + "
                "rollout.max_new_tokens)"
            )
        kinds = vllm.sampling_params.RequestOutputKind
        entropy = request.entropy and engine.settings.sampler_entropy
        seed = request.seed
        if seed is None and self.generator is not None:
            seed = draw_seed(self.generator)
        sampling = vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=budget,
            logprobs=params.logprobs_top_k,
            seed=seed,
            stop_token_ids=engine.eos_token_ids,
            detokenize=False,
            # one flat list per request instead of a dict per token (read without a per-token loop)
            flat_logprobs=True,
            # only the finished output (what LLM.generate asks for), or a stream's new tokens; the
            # cumulative default would rebuild every running request's output at every engine step
            output_kind=kinds.DELTA if request.stream else kinds.FINAL_ONLY,
            # its rows' entropies are recorded as it samples (vllm.entropy; greedy rows are not tempered)
            extra_args={ENTROPY_KEY: request_id} if entropy and params.temperature > 0 else None,
        )
        return request_id, vllm.TokensPrompt(prompt_token_ids=context), sampling

    def _to_generation(self, completion: Any, k: int) -> Generation:
        """A ``Generation`` from vLLM's output. Its flat log-probs hold, per position, the sampled
        token's entry and then the k largest in rank order (vLLM's sampler puts the sampled one
        first): (n, k + 1) tables, read at once."""
        tokens = list(completion.token_ids)
        n = len(tokens)
        self.cost.sampled_tokens += n
        flat = completion.logprobs
        values = torch.tensor(flat.logprobs, dtype=torch.float32).view(n, k + 1)
        ids = torch.tensor(flat.token_ids, dtype=torch.long).view(n, k + 1)
        if n and not torch.equal(ids[:, 0], torch.tensor(tokens)):
            raise EngineError(
                "vLLM's log-probs do not start with the sampled token; this vLLM version is not supported"
            )
        logprobs, top_lps, top_ids = values[:, 0].clone(), values[:, 1:].clone(), ids[:, 1:].clone()
        # a stream's pieces: only the last has the finish reason
        finished = bool(n) and tokens[-1] in self.engine.eos_token_ids and completion.finish_reason == "stop"
        return Generation(
            token_ids=torch.tensor(tokens, dtype=torch.long),
            logprobs=logprobs,
            top_logprobs=top_lps,
            top_ids=top_ids,
            entropy=None,
            finished=finished,
        )
