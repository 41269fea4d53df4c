"""The ``vllm`` engine: vLLM colocated in the training process (docs/engines.md).

The engine core runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so its
weights can be replaced in place after every optimizer update (``sync_weights``: vLLM's
``reload_weights`` through ``LLM.collective_rpc``, then ``reset_prefix_cache``). Every request is a
token prompt (prompt + prefix for tree branches) with its own seed, drawn from the caller's
generator when the request has none, so a seeded run repeats. Automatic prefix caching does the
KV reuse of tree rollouts in whole blocks of ``rollout.vllm_block_size`` tokens.

What vLLM returns, and how it maps onto ``Generation``:
- ``logprobs``: ``logprobs_mode="processed_logprobs"`` gives log-probs after temperature and
  top-p/top-k. With top_p = 1 and top_k = 0 that is exactly the trainer's definition (tempered,
  unfiltered); with top_p < 1 or top_k > 0 it is the renormalised filtered distribution, which
  training refuses (``semrl.config.engine_checks``) and evaluation does not read.
- ``top_logprobs`` / ``top_ids``: the k entries of rank 1..k (vLLM adds the sampled token as a
  (k+1)-th entry when it is outside the top k; that entry is dropped here, and ROSE's
  ``rose.entropy_with_sampled`` puts it back from ``logprobs`` as the ROSE code does).
- ``entropy``: None. vLLM never returns the full-vocabulary entropy; the trainer measures it
  (``semrl.update.row_logprobs.with_sampling_entropy``, the update's forwards).
"""

from __future__ import annotations

import atexit
import gc
import importlib.util
import itertools
import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import PretrainedConfig, PreTrainedModel

from semrl.config.engine_checks import CPU_BLOCK_MULTIPLE, CPU_MIN_HEAD_DIM, INSTALL_HINT
from semrl.core.distributed import on_close
from semrl.errors import ConfigError, EngineError, TrainingError
from semrl.models.lora import sampling_weights
from semrl.rollout.engines.base import (
    EngineCost,
    Generation,
    GenerationRequest,
    OnDone,
    RequestRecord,
    SamplingParams,
    Tag,
    request_budget,
)

if TYPE_CHECKING:
    from semrl.config.sections import RolloutConfig

logger = logging.getLogger(__name__)

GIB = 1 << 30
_REQUEST_IDS = itertools.count()  # request ids of generate_dynamic, unique in the process
MAX_BATCHED_TOKENS = 8192  # default engine-step budget when the batch's prompts need more


@dataclass(frozen=True)
class VLLMSettings:
    """Engine-wide vLLM options (per-request options travel in ``SamplingParams``).

    Attributes:
        max_num_seqs: sequences in the running batch.
        max_num_batched_tokens: tokens per engine step (longer prefills are chunked).
        dtype: the engine's weights and compute; None: the model's dtype.
        sleep_level: vLLM sleep mode between rollouts (CUDA only): 0 off, 1 or 2 (vLLM's levels).
    """

    max_model_len: int
    max_num_seqs: int
    max_logprobs: int
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.3
    block_size: int = 32
    seed: int = 0
    dtype: str | None = None
    max_num_batched_tokens: int | None = None
    sleep_level: int = 0

    @classmethod
    def from_options(
        cls,
        options: RolloutConfig | None,
        max_model_len: int,
        max_num_seqs: int,
        max_logprobs: int,
        seed: int,
        dtype: str | None = None,
        on_gpu: bool = False,
    ) -> VLLMSettings:
        """From the ``rollout`` config section (``vllm_*`` keys), or defaults when it is None.
        ``max_num_seqs`` and ``dtype`` are the defaults of ``vllm_max_num_seqs`` and ``vllm_dtype``
        (on a GPU the dtype defaults to bfloat16)."""
        extra: dict[str, Any] = {}
        batched_tokens = None
        if options is not None:
            extra = {
                "kv_cache_gib": options.vllm_kv_cache_gib,
                "gpu_memory_utilization": options.vllm_gpu_memory_utilization,
                "block_size": options.vllm_block_size,
            }
            max_num_seqs = options.vllm_max_num_seqs or max_num_seqs
            batched_tokens = options.vllm_max_num_batched_tokens
            dtype = options.vllm_dtype or ("bfloat16" if on_gpu else dtype)
            sleeps = options.vllm_sleep if options.vllm_sleep is not None else on_gpu
            extra["sleep_level"] = options.vllm_sleep_level if sleeps else 0
        block = extra.get("block_size", cls.block_size)
        # vLLM allocates the KV cache in whole blocks, so the model length is rounded up to one.
        length = -(-max_model_len // block) * block
        if batched_tokens is None:  # the whole batch's prefill in one step up to 8192 tokens (verl's budget)
            batched_tokens = max(length, min(max_num_seqs * length, MAX_BATCHED_TOKENS))
        return cls(
            length,
            max_num_seqs,
            max(1, max_logprobs),
            seed=seed,
            dtype=dtype,
            max_num_batched_tokens=batched_tokens,
            **extra,
        )

    def engine_dtype(self, model: PreTrainedModel) -> str:
        return self.dtype or str(model.dtype).removeprefix("torch.")


@dataclass
class _Started:
    """An engine of this process: its settings, vLLM's ``LLM``, and whether the default process group
    existed before it started (then it belongs to accelerate and must outlive the engine)."""

    settings: VLLMSettings
    llm: Any
    foreign_process_group: bool


# One vLLM engine per process and model shape: a second Trainer (or test, or evaluation) with the
# same model shape reuses it when its lengths fit, and pushes its own weights in, instead of paying
# vLLM's ~45 s start-up again. key -> (settings it was started with, LLM)
_ENGINES: dict[tuple[Any, ...], _Started] = {}


def check_vllm_machine(rollout: RolloutConfig) -> None:
    """The ``rollout.engine=vllm`` settings that depend on the machine (whether it has CUDA),
    checked when training starts, before the models load; ``semrl.config.engine_checks`` checks the
    others when the config loads."""
    if not torch.cuda.is_available() and rollout.vllm_block_size % CPU_BLOCK_MULTIPLE:
        raise ConfigError(
            f"rollout.vllm_block_size={rollout.vllm_block_size}: vLLM's CPU backend needs a multiple of "
            f"{CPU_BLOCK_MULTIPLE}"
        )
    if rollout.vllm_sleep and not torch.cuda.is_available():
        raise ConfigError(
            "rollout.vllm_sleep=true: vLLM's sleep mode needs CUDA and this machine has no GPU; "
            "set rollout.vllm_sleep=null (on with CUDA only) or false"
        )


def kv_bytes_per_token(config: PretrainedConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V over all layers for one token of ``config``'s model."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return cast("int", 2 * config.num_hidden_layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8)


def check_model_for_vllm(model: PreTrainedModel, settings: VLLMSettings, on_gpu: bool) -> None:
    """Fail before vLLM starts when it could not run this model with these settings."""
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if not on_gpu and head_dim < CPU_MIN_HEAD_DIM:
        raise EngineError(
            f"vLLM's CPU attention needs a head dimension >= {CPU_MIN_HEAD_DIM}; model "
            f"'{model.name_or_path}' has {head_dim}: set rollout.engine=hf for this model"
        )
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and settings.max_model_len > positions:
        raise EngineError(
            f"prompt + response length {settings.max_model_len} exceeds the model's {positions} positions; "
            "lower data.max_prompt_length or rollout.max_new_tokens"
        )
    if not on_gpu:
        per_token = kv_bytes_per_token(config, getattr(torch, settings.engine_dtype(model)))
        need = settings.max_model_len * per_token
        have = int(settings.kv_cache_gib * GIB)
        if have < need:
            raise EngineError(
                f"rollout.vllm_kv_cache_gib={settings.kv_cache_gib} "
                f"holds {have // per_token} tokens, fewer than "
                f"one sequence of {settings.max_model_len} tokens ({need / GIB:.3f} GiB); raise "
                "rollout.vllm_kv_cache_gib "
                "or lower rollout.max_new_tokens"
            )
        if have < need * settings.max_num_seqs:
            logger.warning(
                "vllm: the KV cache (%.2f GiB) holds %d full-length "
                "sequences of the %d in a batch; vLLM will run "
                "fewer at once (raise rollout.vllm_kv_cache_gib to %.2f for all)",
                settings.kv_cache_gib,
                have // need,
                settings.max_num_seqs,
                need * settings.max_num_seqs / GIB,
            )


def _import_vllm() -> Any:
    if importlib.util.find_spec("vllm") is None:
        raise EngineError(
            f"rollout.engine=vllm needs vLLM, which is not installed: {INSTALL_HINT}; or set "
            "rollout.engine=hf"
        )
    if importlib.util.find_spec("torchvision") is not None:
        try:
            import torchvision  # noqa: F401
        except Exception as err:  # the PyPI build of torchvision does not load beside the CPU torch
            raise EngineError(
                "torchvision is installed but does not load "
                f"({type(err).__name__}: {err}); vLLM's dependencies "
                "pull a torchvision built for another torch. Nothing in semrl needs it: "
                "pip uninstall -y torchvision torchaudio torchcodec"
            ) from err
    # The engine core runs in this process so that the trainer can update its weights in place and
    # its scheduling is deterministic.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    import vllm

    return vllm


def _engine_key(model: PreTrainedModel, settings: VLLMSettings) -> tuple[Any, ...]:
    skip = ("_name_or_path", "transformers_version")
    config = {k: v for k, v in model.config.to_dict().items() if k not in skip}
    shape = json.dumps(config, sort_keys=True, default=str)
    return (
        shape,
        settings.engine_dtype(model),
        str(model.device),
        settings.block_size,
        settings.kv_cache_gib,
        settings.gpu_memory_utilization,
        settings.seed,
        settings.sleep_level,
    )


def _fits(started: VLLMSettings, wanted: VLLMSettings) -> bool:
    return (
        started.max_model_len >= wanted.max_model_len
        and started.max_logprobs >= wanted.max_logprobs
        and started.max_num_seqs >= wanted.max_num_seqs
        and (started.max_num_batched_tokens or 0) >= (wanted.max_num_batched_tokens or 0)
    )


def weights_view(path: str | Path) -> str:
    """A directory vLLM can load: ``path`` itself, or, for a training checkpoint, a directory of
    links to its model files. vLLM loads every ``*.safetensors`` of a directory, and a checkpoint
    also holds the optimizer state in ``trainer_state.safetensors`` ("no module or parameter
    named 't0'")."""
    from semrl.core.safe_state import STATE_TENSORS

    source = Path(path)
    if not (source / STATE_TENSORS).is_file():
        return str(path)
    view = Path(tempfile.mkdtemp(prefix="semrl-vllm-weights-"))
    atexit.register(shutil.rmtree, view, True)
    for item in source.iterdir():
        if item.name != STATE_TENSORS and not item.name.startswith(".") and item.is_file():
            (view / item.name).symlink_to(item.resolve())
    return str(view)


def _start_llm(vllm: Any, model: PreTrainedModel, settings: VLLMSettings) -> Any:
    on_gpu = model.device.type == "cuda"
    kwargs: dict[str, Any] = {
        "model": weights_view(str(model.name_or_path)),
        "skip_tokenizer_init": True,  # requests are token ids; nothing is detokenized
        "dtype": settings.engine_dtype(model),
        "seed": settings.seed,
        "enable_prefix_caching": True,
        "block_size": settings.block_size,
        "max_model_len": settings.max_model_len,
        "max_num_seqs": settings.max_num_seqs,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "logprobs_mode": "processed_logprobs",
        "max_logprobs": settings.max_logprobs,
    }
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        # one engine per training process, as TRL's colocate mode: vLLM joins the existing process
        # group (RANK, WORLD_SIZE, MASTER_ADDR/PORT are set by accelerate) instead of forming its own
        kwargs["distributed_executor_backend"] = "external_launcher"
    if on_gpu:
        kwargs["gpu_memory_utilization"] = settings.gpu_memory_utilization
        kwargs["enable_sleep_mode"] = settings.sleep_level > 0
    else:
        kwargs["kv_cache_memory_bytes"] = int(settings.kv_cache_gib * GIB)
    # vLLM's CPU worker sets torch to one thread and replaces torch.set_num_threads with a no-op;
    # the training that shares this process needs both back.
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        return vllm.LLM(**kwargs)
    except Exception as err:
        # vLLM's messages can list every architecture it knows: keep the first lines, shortened
        detail = " ".join(line.strip()[:200] for line in str(err).splitlines()[:2])
        raise EngineError(
            f"vLLM could not start on model '{model.name_or_path}' ({type(err).__name__}: {detail}); "
            "set rollout.engine=hf for this model, or change the rollout.vllm_* settings the message names"
        ) from err
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)


class VLLMEngine:
    """Samples with vLLM from the weights of ``model`` (the trained Hugging Face model).

    ``model`` stays the source of truth: the engine starts from its directory, takes its current
    weights at once, and again at every ``sync_weights``; ``with_sampling_entropy`` and ROSE's
    embeddings read it too.
    """

    name = "vllm"
    computes_entropy = False
    continuous_batching = True

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
        vllm = _import_vllm()
        self._vllm = vllm
        key = _engine_key(model, settings)
        if key not in _ENGINES or not _fits(_ENGINES[key].settings, settings):
            # a replaced engine (or on a GPU any other: vLLM would count its memory as taken) is shut
            # down before the new one starts, so its memory is free
            for other in [k for k in _ENGINES if k == key or on_gpu]:
                _shutdown(_ENGINES.pop(other))
            logger.info(
                "starting vLLM on %s (once per process; about 45 s on a 2-core CPU)", model.name_or_path
            )
            # the first engine of the process tells whether the default group is someone else's
            foreign = (
                next(iter(_ENGINES.values())).foreign_process_group
                if _ENGINES
                else (torch.distributed.is_initialized())
            )
            _ENGINES[key] = _Started(settings, _start_llm(vllm, model, settings), foreign)
            on_close(shutdown_engines)
        self.llm = _ENGINES[key].llm
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
        if self.llm.reset_prefix_cache():
            return
        core = self.llm.llm_engine
        while core.has_unfinished_requests():
            core.step()
        if not self.llm.reset_prefix_cache():
            raise TrainingError(
                "vLLM refused to reset its prefix cache after a weight update (blocks are still held), so "
                "cached prefixes would serve KV computed with the old weights; stopping. Run with "
                "rollout.engine=hf, or report this with the vLLM version"
            )

    @property
    def generated_tokens(self) -> int:
        return self.cost.sampled_tokens

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
        ``return_cache`` is ignored: vLLM's prefix cache keeps the KV of shared prefixes."""
        self._drive(requests, params, generator, on_done)
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

        self._drive(list(enumerate(requests)), params, generator, keep)
        done = [r for r in results if r is not None]
        if len(done) != len(requests):
            raise EngineError(f"vLLM returned {len(done)} of {len(requests)} requests")
        return done

    def _drive(
        self,
        requests: list[tuple[Tag, GenerationRequest]],
        params: SamplingParams,
        generator: torch.Generator | None,
        on_done: OnDone[Tag],
    ) -> None:
        """The one loop under ``generate`` and ``generate_dynamic`` (the loop ``LLM.generate`` runs):
        add requests, step the engine, hand each finished request to ``on_done`` and add what it
        returns in the same iteration, so no request waits for another's round. Counts the cost: the
        context tokens each request computed (``len(context) - num_cached_tokens``), the engine steps
        and the sequences in each."""
        if not requests:
            return
        self._check_awake()
        core = self.llm.llm_engine
        scheduler = _scheduler(core)
        running: dict[str, tuple[Tag, GenerationRequest, int, int]] = {}

        def submit(pairs: list[tuple[Tag, GenerationRequest]]) -> None:
            for tag, request in pairs:
                prompt, sampling = self._prepare(request, params, generator)
                request_id = f"semrl-{next(_REQUEST_IDS)}"
                core.add_request(request_id, prompt, sampling)
                running[request_id] = (tag, request, len(prompt["prompt_token_ids"]), self.cost.engine_steps)
            self.cost.requests += len(pairs)

        submit(requests)
        while running:
            outputs = core.step()
            finished = [out for out in outputs if out.finished]
            self.cost.engine_steps += 1
            # the step ran the sequences still running after it and those it finished
            self.cost.running_rows += (len(scheduler.running) if scheduler is not None else 0) + len(finished)
            for out in finished:
                tag, request, context, submitted = running.pop(out.request_id)
                prefill = context - (out.num_cached_tokens or 0)
                self.cost.prefill_tokens += prefill
                generation = self._to_generation(out.outputs[0], params.logprobs_top_k)
                if self.sampled_by_prompt is not None:
                    self.sampled_by_prompt[tuple(request.prompt_ids)] += len(generation.token_ids)
                if self.request_log is not None:
                    self.request_log.append(
                        RequestRecord(
                            tag,
                            context,
                            prefill,
                            len(generation.token_ids),
                            submitted,
                            self.cost.engine_steps,
                        )
                    )
                submit(on_done(tag, request, generation))

    def _prepare(
        self, request: GenerationRequest, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[Any, Any]:
        """vLLM's token prompt and sampling parameters for one request."""
        vllm = self._vllm
        budget = request_budget(request, params)
        context = request.prompt_ids + request.prefix_ids
        if len(context) + budget > self.settings.max_model_len:
            raise ValueError(
                f"a request of {len(context)} context + {budget} new tokens exceeds the vllm engine's "
                f"max_model_len {self.settings.max_model_len} (data.max_prompt_length + "
                "rollout.max_new_tokens)"
            )
        seed = request.seed
        if seed is None and generator is not None:
            seed = int(torch.randint(2**62, (1,), generator=generator))
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
            # only the finished output (what LLM.generate asks for); the cumulative default would
            # rebuild every running request's output at every engine step
            output_kind=vllm.sampling_params.RequestOutputKind.FINAL_ONLY,
        )
        return vllm.TokensPrompt(prompt_token_ids=context), sampling

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
        finished = bool(n) and tokens[-1] in self.eos_token_ids and completion.finish_reason == "stop"
        return Generation(
            token_ids=torch.tensor(tokens, dtype=torch.long),
            logprobs=logprobs,
            top_logprobs=top_lps,
            top_ids=top_ids,
            entropy=None,
            finished=finished,
        )


def _scheduler(core: Any) -> Any:
    """The scheduler of an in-process engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), whose
    ``running`` list gives the running batch; None where this vLLM keeps it elsewhere."""
    return getattr(getattr(getattr(core, "engine_core", None), "engine_core", None), "scheduler", None)


def shutdown_engines() -> None:
    """Stop this process's vLLM engines; multi-process runs call it before leaving the process
    group, since vLLM's own clean-up at exit would otherwise touch groups already destroyed."""
    while _ENGINES:
        _shutdown(_ENGINES.popitem()[1])


def _shutdown(started: _Started) -> None:
    """Stop one engine and free its memory. vLLM's shutdown unfreezes the garbage collector (frozen
    at start-up, which would keep a dropped engine's memory forever) and ends by destroying the
    default process group: one that existed before the first engine (accelerate's), or that other
    engines still use, is kept. Call it after removing ``started`` from ``_ENGINES``."""
    destroy = torch.distributed.destroy_process_group

    def destroy_vllm_groups_only(group: Any = None) -> None:
        if group is not None:
            destroy(group)

    if started.foreign_process_group or _ENGINES:  # accelerate's, or still used by other engines
        torch.distributed.destroy_process_group = destroy_vllm_groups_only
    try:
        started.llm.llm_engine.engine_core.shutdown()
    finally:
        torch.distributed.destroy_process_group = destroy
    started.llm = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
