"""The ``vllm`` engine: vLLM colocated in the training process (docs/engines.md).

The engine core runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so its
weights can be replaced in place after every optimizer update (``sync_weights``: vLLM's
``reload_weights`` through ``LLM.collective_rpc``, then ``reset_prefix_cache``). Every request is a
token prompt (prompt + prefix for tree branches) with its own seed, drawn from the caller's
generator when the request has none, so a seeded run repeats. Automatic prefix caching does the
KV reuse of tree rollouts in whole blocks of ``rollout.vllm_block_size`` tokens. Starting vLLM, and
the one engine per process and model shape that later engines reuse, is
``semrl.rollout.engines.vllm_start``.

What vLLM returns, and how it maps onto ``Generation``:
- ``logprobs``: ``logprobs_mode="processed_logprobs"`` gives log-probs after temperature and
  top-p/top-k. With top_p = 1 and top_k = 0 that is exactly the trainer's definition (tempered,
  unfiltered); with top_p < 1 or top_k > 0 it is the renormalised filtered distribution, which
  training refuses (``semrl.config.engine_checks``) and evaluation does not read.
- ``top_logprobs`` / ``top_ids``: the k entries of rank 1..k (vLLM adds the sampled token as a
  (k+1)-th entry when it is outside the top k; that entry is dropped here, and ROSE's
  ``rose.entropy_with_sampled`` puts it back from ``logprobs`` as the ROSE code does).
- ``entropy``: recorded by vLLM's sampler for a request that asks (``GenerationRequest.entropy``,
  ``semrl.rollout.engines.vllm_entropy``), else None: the trainer measures it
  (``semrl.update.row_logprobs.with_sampling_entropy``, the update's forwards).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic

import torch
from transformers import PreTrainedModel

from semrl.core.distributed import is_sharded
from semrl.core.watchdog import beat
from semrl.errors import EngineError, TrainingError
from semrl.models.lora import sampling_weights
from semrl.rollout.engines.base import (
    EngineCost,
    EnginePowers,
    Generation,
    GenerationRequest,
    HeldKV,
    OnDone,
    OnTokens,
    PrefixCache,
    RequestRecord,
    SamplingParams,
    Tag,
    request_budget,
    require_power,
    sampling_time,
)
from semrl.rollout.engines.row_loop import RowLoop
from semrl.rollout.engines.vllm_entropy import ENTROPY_KEY, forget, take
from semrl.rollout.engines.vllm_fork import ForkHooks, install_fork_hooks, say_once
from semrl.rollout.engines.vllm_start import VLLMSettings, check_model_for_vllm, import_vllm, shared_llm
from semrl.rollout.seeds import draw_seed

_REQUEST_IDS = itertools.count()  # request ids of generate_dynamic, unique in the process


class VLLMEngine:
    """Samples with vLLM from the weights of ``model`` (the trained Hugging Face model).

    ``model`` stays the source of truth: the engine starts from its directory, takes its current
    weights at once, and again at every ``sync_weights``; ``with_sampling_entropy`` and ROSE's
    embeddings read it too.
    """

    name = "vllm"

    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_ids: list[int],
        settings: VLLMSettings,
        initial_weights: Iterable[tuple[str, torch.Tensor]] | None = None,
    ) -> None:
        """``initial_weights``: the stream the engine starts from (a sharded model's gathered
        tensors); None: the model's own."""
        self.model = model
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.settings = settings
        self.cost = EngineCost()
        self.request_log: list[RequestRecord] | None = None
        self.sampled_by_prompt: Counter[tuple[int, ...]] | None = None
        self.compute_dtype: torch.dtype = getattr(torch, settings.engine_dtype(model))
        self.batch_size = settings.max_num_seqs
        self.asleep = False
        embeddings: Any = model.get_input_embeddings()
        embedding: torch.Tensor = embeddings.weight
        self._embedding_key = next(name for name, param in model.named_parameters() if param is embedding)
        self._embeddings = embedding
        on_gpu = model.device.type == "cuda"
        check_model_for_vllm(model, settings, on_gpu=on_gpu)
        self._vllm = import_vllm()
        self.llm = shared_llm(self._vllm, model, settings)
        self._forks: ForkHooks | None = None
        if settings.fork:
            self._forks, reason = install_fork_hooks(
                self.llm, self._vllm.__version__, _scheduler(self.llm.llm_engine)
            )
            if reason is not None:
                say_once(
                    reason,
                    "rollout.vllm_fork: %s; tree children take vLLM's prefix cache instead (the same "
                    "tokens, more recomputed context; rollout/fork_fallbacks counts them)",
                    reason,
                )
        # a fork (vLLM 0.32's copy-on-write path), streaming, and the row loop on the trained model
        # unless it is sharded
        self.powers = EnginePowers(
            fork=self._forks is not None,
            streaming=True,
            row_loop=not is_sharded(model),
            continuous_batching=True,
            records_entropy=self.settings.sampler_entropy,
        )
        self.sync_weights(initial_weights)  # a reused engine may hold another model's weights

    def release_memory(self) -> None:
        """After a rollout, with sleep mode on: vLLM sleeps (KV cache released; at level 2 the weights
        too) until ``sync_weights`` wakes it around the next weight push."""
        if self.settings.sleep_level and not self.asleep:
            self.llm.sleep(level=self.settings.sleep_level)
            self.asleep = True

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Stream new weights into vLLM (``reload_weights`` consumes them one at a time): ``weights``
        (gathered full tensors under FSDP) or the model's own, merged under LoRA. An engine asleep
        wakes its weights first and its KV cache only once they are loaded, so the two never take
        memory together with the gather (verl's order)."""
        gathered = weights is not None

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights if weights is not None else sampling_weights(self.model):
                if gathered and name == self._embedding_key:  # the model is sharded: ROSE reads these
                    self._embeddings = tensor
                yield name, tensor.detach()

        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream()})
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self._reset_prefix_cache()

    def _check_awake(self) -> None:
        if self.asleep:
            raise EngineError(
                "the vllm engine was asked to sample while asleep (rollout.vllm_sleep): its weights "
                "return only with the next weight push; call sync_weights first"
            )

    def _reset_prefix_cache(self) -> None:
        """A prefix cached under the old weights must never serve a new request. vLLM's reset returns
        False (with only a warning) while a request still holds blocks: then the finished requests
        are let go by stepping the idle engine and the reset is tried once more; a second refusal
        stops the run rather than sample from KV computed with the old weights."""
        if self._forks is not None:
            self._forks.release_all()
        if self.llm.reset_prefix_cache():
            return
        core = self.llm.llm_engine
        while core.has_unfinished_requests():
            core.step()
            beat()
        if not self.llm.reset_prefix_cache():
            raise TrainingError(
                "vLLM refused to reset its prefix cache after a weight update (blocks are still held), so "
                "cached prefixes would serve KV computed with the old weights; stopping. Run with "
                "rollout.engine=hf, or report this with the vLLM version"
            )

    @property
    def generated_tokens(self) -> int:
        return self.cost.sampled_tokens

    def row_loop(self) -> RowLoop:
        """LATR's lookahead rows on the trained model (the official split: the lookahead on the
        transformers side, then vLLM finishes the rows), padded with the smallest EOS id."""
        require_power(self, "row_loop", "lookahead rows on the model")
        pad = min(self.eos_token_ids)  # its KV is the training model's, which vLLM cannot continue
        return RowLoop(self.model, self.compute_dtype, pad, self.cost, self.sampled_by_prompt, hands_kv=False)

    def release_kv(self, kv: PrefixCache | HeldKV) -> None:
        """Let go of a finished request's held blocks (its children have their requests)."""
        if isinstance(kv, HeldKV) and self._forks is not None:
            self._forks.release(kv.request_id)

    def input_embeddings(self) -> torch.Tensor:
        """(V, D) input embeddings of the weights the engine samples from."""
        return self._embeddings.detach()

    def generate_dynamic(
        self,
        requests: list[tuple[Tag, GenerationRequest]],
        params: SamplingParams,
        generator: torch.Generator | None,
        on_done: OnDone[Tag],
        return_cache: bool = False,
    ) -> int:
        """Sample tagged requests; what ``on_done(tag, request, generation)`` returns for a finished
        one joins the running batch at once (vLLM's ``LLMEngine.add_request`` / ``step``); one call.
        ``return_cache`` (with the fork power): each finished request's blocks are held for its
        children (``Generation.cache``, a ``HeldKV``) until ``release_kv`` or the call's end; a request
        whose ``cache`` names one continues it. Without the power vLLM's prefix cache keeps the KV of
        shared prefixes in whole blocks."""
        with sampling_time(self.cost):
            self._drive(requests, params, generator, on_done, hold=return_cache)
        return 1

    def generate(
        self,
        requests: list[GenerationRequest],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        return_cache: bool = False,  # unused: prefix caching replaces explicit KV caches
        on_finished: Callable[[int], Any] | None = None,
    ) -> list[Generation]:
        results: list[Generation | None] = [None] * len(requests)

        def keep(index: int, _: GenerationRequest, out: Generation) -> list[tuple[Any, GenerationRequest]]:
            results[index] = out
            if on_finished is not None:
                on_finished(1)
            return []

        with sampling_time(self.cost):
            self._drive(list(enumerate(requests)), params, generator, keep)
        done = [r for r in results if r is not None]
        if len(done) != len(requests):
            raise EngineError(f"vLLM returned {len(done)} of {len(requests)} requests")
        return done

    def generate_streaming(
        self,
        requests: list[tuple[Tag, GenerationRequest]],
        params: SamplingParams,
        stream_params: SamplingParams,
        generator: torch.Generator | None,
        on_done: OnDone[Tag],
        on_tokens: OnTokens[Tag],
        hold: bool = False,
    ) -> None:
        """``generate_dynamic`` with streamed requests beside the others, in one running batch. A
        request with ``stream=True`` samples with ``stream_params`` (temperature 0: greedily) and hands
        its new tokens to ``on_tokens`` after every engine step, for all such requests at once, as
        pieces (``Generation``; the last has ``finished`` set when it ended with EOS); it never goes to
        ``on_done``. What ``on_tokens`` returns starts at once, and the streamed requests it names stop
        (vLLM's ``abort_request``): LATR grows and prunes its rows this way (docs/methods/latr.md).
        Tags must be hashable. ``hold`` (with the fork power): as ``generate_dynamic``'s
        ``return_cache``, and a stream's pieces carry its ``HeldKV`` too, which a request may continue
        while the stream still runs or after it stopped."""
        with sampling_time(self.cost):
            self._drive(requests, params, generator, on_done, (stream_params, on_tokens), hold)

    # One loop, one screen: a request's admission, its cost and its end read in the order vLLM runs them.
    def _drive(  # noqa: C901, PLR0912, PLR0915
        self,
        requests: list[tuple[Tag, GenerationRequest]],
        params: SamplingParams,
        generator: torch.Generator | None,
        on_done: OnDone[Tag],
        streaming: tuple[SamplingParams, OnTokens[Tag]] | None = None,
        hold: bool = False,
    ) -> None:
        """The one loop under ``generate``, ``generate_dynamic`` and ``generate_streaming`` (the loop
        ``LLM.generate`` runs): add requests, step the engine, hand each finished request to
        ``on_done`` and each streamed request's new tokens to ``on_tokens``, and add what they return
        in the same iteration, so no request waits for another's round. Counts the cost: the context
        tokens each request computed (``len(context) - num_cached_tokens``, when its first output
        comes), the engine steps and the sequences in each."""
        if not requests:
            return
        self._check_awake()
        core = self.llm.llm_engine
        scheduler = _scheduler(core)
        running: dict[str, _Running[Tag]] = {}
        by_tag: dict[Tag, str] = {}  # streamed requests' ids, for stopping them
        forks, streams = self._forks, streaming is not None
        if forks is not None:
            forks.start_call()

        def submit(pairs: list[tuple[Tag, GenerationRequest]]) -> None:
            for tag, request in pairs:
                sampler = streaming[0] if request.stream and streaming is not None else params
                request_id, prompt, sampling = self._prepare(request, sampler, generator, streams)
                if forks is not None:
                    forks.mark(request_id, request, hold)
                core.add_request(request_id, prompt, sampling)
                context = len(prompt["prompt_token_ids"])
                running[request_id] = _Running(tag, request, context, self.cost.engine_steps, sampler)
                if request.stream:
                    by_tag[tag] = request_id
            self.cost.requests += len(pairs)

        def settle(entry: _Running[Tag], out: Any, generation: Generation) -> None:
            if entry.prefill is None:
                entry.prefill = entry.context - (out.num_cached_tokens or 0)
                self.cost.prefill_tokens += entry.prefill
            entry.sampled += len(generation.token_ids)
            if self.sampled_by_prompt is not None:
                self.sampled_by_prompt[tuple(entry.request.prompt_ids)] += len(generation.token_ids)

        def log(entry: _Running[Tag]) -> None:
            if self.request_log is not None:
                steps = self.cost.engine_steps
                record = RequestRecord(
                    entry.tag, entry.context, entry.prefill or 0, entry.sampled, entry.submitted, steps
                )
                self.request_log.append(record)

        try:
            submit(requests)
            while running:
                outputs = core.step()
                beat()
                if forks is not None:
                    forks.after_step(bool(outputs))
                finished = [out for out in outputs if out.finished]
                self.cost.engine_steps += 1
                # the step ran the sequences still running after it and those it finished
                self.cost.running_rows += (len(scheduler.running) if scheduler is not None else 0) + len(
                    finished
                )
                pieces: list[tuple[Tag, Generation]] = []
                for out in outputs:
                    entry = running.get(out.request_id)
                    if entry is None:  # a stream stopped in this step's callback
                        continue
                    generation = self._to_generation(out.outputs[0], entry.params.logprobs_top_k)
                    if entry.request.entropy and out.finished:
                        generation.entropy = take(out.request_id, len(generation.token_ids))
                    if forks is not None:
                        generation.cache = forks.handle(
                            out.request_id, out.finished, hold and entry.request.stream
                        )
                    settle(entry, out, generation)
                    if out.finished:
                        del running[out.request_id]
                        log(entry)
                    if entry.request.stream:
                        pieces.append((entry.tag, generation))
                        if out.finished:
                            del by_tag[entry.tag]
                    elif out.finished:
                        submit(on_done(entry.tag, entry.request, generation))
                if streaming is not None and pieces:
                    started, stopped = streaming[1](pieces)
                    if stopped:
                        ids = [by_tag.pop(tag) for tag in stopped if tag in by_tag]
                        core.abort_request(ids)
                        for request_id in ids:
                            log(running.pop(request_id))
                    submit(started)
        except BaseException:
            # a callback (or the engine) raised: the requests still running must not hold blocks and
            # slots into the next call, whose steps would drop their outputs
            if running:
                core.abort_request(list(running))
            raise
        finally:
            forget(list(running))
            if forks is not None:  # no hold outlives its call
                forked, fallbacks, refused = forks.end_call()
                self.cost.forked_requests += forked
                self.cost.fork_fallbacks += fallbacks
                self.cost.holds_refused += refused

    def _prepare(
        self,
        request: GenerationRequest,
        params: SamplingParams,
        generator: torch.Generator | None,
        streaming: bool,
    ) -> tuple[str, Any, Any]:
        """A new request id, vLLM's token prompt and its sampling parameters (a call that streams or not)."""
        vllm = self._vllm
        request_id = f"semrl-{next(_REQUEST_IDS)}"
        budget = request_budget(request, params, streaming)
        context = request.prompt_ids + request.prefix_ids
        if len(context) + budget > self.settings.max_model_len:
            raise ValueError(
                f"a request of {len(context)} context + {budget} new tokens exceeds the vllm engine's "
                f"max_model_len {self.settings.max_model_len} (data.max_prompt_length + "
                "rollout.max_new_tokens)"
            )
        kinds = vllm.sampling_params.RequestOutputKind
        entropy = request.entropy and self.settings.sampler_entropy
        seed = request.seed
        if seed is None and generator is not None:
            seed = draw_seed(generator)
        sampling = vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=budget,
            logprobs=params.logprobs_top_k,
            seed=seed,
            stop_token_ids=self.eos_token_ids,
            detokenize=False,
            # one flat list per request instead of a dict per token (read without a per-token loop)
            flat_logprobs=True,
            # only the finished output (what LLM.generate asks for), or a stream's new tokens; the
            # cumulative default would rebuild every running request's output at every engine step
            output_kind=kinds.DELTA if request.stream else kinds.FINAL_ONLY,
            # its rows' entropies are recorded as it samples (vllm_entropy; greedy rows are not tempered)
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
        finished = bool(n) and tokens[-1] in self.eos_token_ids and completion.finish_reason == "stop"
        return Generation(
            token_ids=torch.tensor(tokens, dtype=torch.long),
            logprobs=logprobs,
            top_logprobs=top_lps,
            top_ids=top_ids,
            entropy=None,
            finished=finished,
        )


@dataclass
class _Running(Generic[Tag]):
    """A request in ``VLLMEngine._drive``: its tag, what it asked, its context length, the engine step
    it entered at, its sampler, and what it cost so far."""

    tag: Tag
    request: GenerationRequest
    context: int
    submitted: int
    params: SamplingParams
    prefill: int | None = None  # known from its first output
    sampled: int = 0


def _scheduler(core: Any) -> Any:
    """The scheduler of an in-process engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), whose
    ``running`` list gives the running batch; None where this vLLM keeps it elsewhere."""
    return getattr(getattr(getattr(core, "engine_core", None), "engine_core", None), "scheduler", None)
