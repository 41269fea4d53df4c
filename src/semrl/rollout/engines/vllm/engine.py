"""``VLLMEngine``: vLLM colocated in the training process, its weights pushed in after every update
(docs/engines.md; the package's docstring says how vLLM's outputs map onto ``Generation``).

The engine core runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so its
weights can be replaced in place after every optimizer update (``sync_weights``: vLLM's
``reload_weights`` through ``LLM.collective_rpc``, then ``reset_prefix_cache``). Every request is a
token prompt (prompt + prefix for tree branches) with its own seed, drawn from the caller's
generator when the request has none, so a seeded run repeats. Automatic prefix caching does the
KV reuse of tree rollouts in whole blocks of ``rollout.vllm_block_size`` tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

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
    KVHandle,
    OnDone,
    OnTokens,
    RequestRecord,
    SamplingParams,
    Tag,
    require_power,
    sampling_time,
)
from semrl.rollout.engines.row_loop import RowLoop
from semrl.rollout.engines.vllm.drive import EngineCall, scheduler_of
from semrl.rollout.engines.vllm.fork import ForkHooks, HeldKV, install_fork_hooks, say_once
from semrl.rollout.engines.vllm.start import VLLMSettings, check_model_for_vllm, import_vllm, shared_llm


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
        self.vllm = import_vllm()
        self.llm = shared_llm(self.vllm, model, settings)
        self.forks: ForkHooks | None = None
        if settings.fork:
            self.forks, reason = install_fork_hooks(
                self.llm, self.vllm.__version__, scheduler_of(self.llm.llm_engine)
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
            fork=self.forks is not None,
            streaming=True,
            row_loop=not is_sharded(model),
            continuous_batching=True,
            records_entropy=self.settings.sampler_entropy,
            kv_block_size=self.settings.block_size,
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
        if self.forks is not None:
            self.forks.release_all()
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
        return RowLoop(
            self.model, self.compute_dtype, pad, self.cost, self.sampled_by_prompt, reuse_kv_cache=False
        )

    def release_kv(self, kv: KVHandle) -> None:
        """Let go of a finished request's held blocks (its children have their requests)."""
        if isinstance(kv, HeldKV) and self.forks is not None:
            self.forks.release(kv.request_id)

    def input_embeddings(self) -> torch.Tensor:
        """(V, D) input embeddings of the weights the engine samples from."""
        return self._embeddings.detach()

    def generate_dynamic(
        self,
        requests: list[tuple[Tag, GenerationRequest]],
        params: SamplingParams,
        generator: torch.Generator | None,
        on_done: OnDone[Tag],
        reuse_kv_cache: bool = False,
    ) -> int:
        """Sample tagged requests; what ``on_done(tag, request, generation)`` returns for a finished
        one joins the running batch at once (vLLM's ``LLMEngine.add_request`` / ``step``); one call.
        ``reuse_kv_cache`` (with the fork power): each finished request's blocks are held for its
        children (``Generation.cache``, a ``HeldKV``) until ``release_kv`` or the call's end; a request
        whose ``cache`` names one continues it. Without the power vLLM's prefix cache keeps the KV of
        shared prefixes in whole blocks."""
        with sampling_time(self.cost):
            self._call(requests, params, generator, on_done, reuse_kv_cache=reuse_kv_cache)
        return 1

    def generate(
        self,
        requests: list[GenerationRequest],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        reuse_kv_cache: bool = False,  # unused: prefix caching replaces explicit KV caches
        on_finished: Callable[[int], Any] | None = None,
    ) -> list[Generation]:
        results: list[Generation | None] = [None] * len(requests)

        def keep(index: int, _: GenerationRequest, out: Generation) -> list[tuple[Any, GenerationRequest]]:
            results[index] = out
            if on_finished is not None:
                on_finished(1)
            return []

        with sampling_time(self.cost):
            self._call(list(enumerate(requests)), params, generator, keep)
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
        reuse_kv_cache: bool = False,
    ) -> None:
        """``generate_dynamic`` with streamed requests beside the others, in one running batch. A
        request with ``stream=True`` samples with ``stream_params`` (temperature 0: greedily) and hands
        its new tokens to ``on_tokens`` after every engine step, for all such requests at once, as
        pieces (``Generation``; the last has ``finished`` set when it ended with EOS); it never goes to
        ``on_done``. What ``on_tokens`` returns starts at once, and the streamed requests it names stop
        (vLLM's ``abort_request``): LATR grows and prunes its rows this way (docs/methods/latr.md).
        Tags must be hashable. ``reuse_kv_cache`` (with the fork power): as ``generate_dynamic``'s, and a
        stream's pieces carry its KV handle too, which a request may continue while the stream still
        runs or after it stopped."""
        with sampling_time(self.cost):
            self._call(requests, params, generator, on_done, (stream_params, on_tokens), reuse_kv_cache)

    def _call(
        self,
        requests: list[tuple[Tag, GenerationRequest]],
        params: SamplingParams,
        generator: torch.Generator | None,
        on_done: OnDone[Tag],
        streaming: tuple[SamplingParams, OnTokens[Tag]] | None = None,
        reuse_kv_cache: bool = False,
    ) -> None:
        """The one loop under ``generate``, ``generate_dynamic`` and ``generate_streaming``
        (``semrl.rollout.engines.vllm.drive.EngineCall``)."""
        if requests:
            self._check_awake()
            EngineCall(self, params, generator, on_done, streaming, reuse_kv_cache).run(requests)
