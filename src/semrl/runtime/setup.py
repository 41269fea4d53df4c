"""Everything a run sets up before its first step, from its config: the run directory, the data,
the models and the sampling engine, the optimizer. The trainer calls these in order."""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import yaml
from transformers import AutoConfig, PreTrainedModel

from semrl.config.files import save_config
from semrl.config.sections import Config, ConfigError
from semrl.core.distributed import ProcessGroup, iter_full_parameters, shard_model
from semrl.core.faults import Faults
from semrl.core.jsonl import log_exists, stored
from semrl.core.watchdog import Watchdog, phase
from semrl.data import DataError, Problem, PromptFormat
from semrl.methods.catalog import get_method
from semrl.models.dtype_choice import ProbeResult, choose_dtype, probe_matmuls
from semrl.models.loading import cache_root, load_model, load_tokenizer, resolve_model_path
from semrl.models.lora import adapters_disabled, add_adapters, is_adapter_checkpoint
from semrl.models.precision import DTYPES, Precision
from semrl.rollout.engines import Engine, build_engine, require_power
from semrl.runtime.checkpoint import cleanup_partial, kept_checkpoint, list_checkpoints, resumable_checkpoint
from semrl.tracking.run_log import LOG_FILES
from semrl.tracking.trackers import Tracker, open_trackers
from semrl.update.packing import supports_packing

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; returns the generator every sampling and shuffling draws from."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def prepare_run_dir(cfg: Config, resume: bool, processes: ProcessGroup) -> Path | None:
    """The checkpoint to resume from (``resume``), or None after creating a new run directory that
    holds the config. Refuses to start a new run over an existing one."""
    run_dir = Path(cfg.logging.output_dir)
    holds_run = bool(list_checkpoints(run_dir)) or log_exists(run_dir / "metrics.jsonl")
    processes.barrier()  # every process has looked before the main one writes
    if resume:
        compressed = [log.name for log in (stored(run_dir / n) for n in LOG_FILES) if log.suffix == ".gz"]
        if compressed:  # a trainer appends to plain logs only
            raise ConfigError(
                f"--resume: {run_dir}'s logs are compressed ({', '.join(compressed)}, as a committed study "
                f"stores them); decompress them first: gunzip {run_dir}/*.jsonl.gz"
            )
        ckpt, skipped = resumable_checkpoint(run_dir)  # damaged newer ones are named in warnings
        if ckpt is None:
            reasons = "".join(f"\n  {c.name}: {'; '.join(problems)}" for c, problems in reversed(skipped))
            raise ConfigError(
                f"--resume: no valid checkpoint in {run_dir / 'checkpoints'}"
                + (f"; found:{reasons}" if skipped else "")
            )
        if processes.is_main:
            cleanup_partial(run_dir)
        return ckpt
    if holds_run:
        raise ConfigError(
            f"run directory {run_dir} already holds a run; continue it with "
            f"'semrl train --resume {run_dir}' or set logging.output_dir to a new directory"
        )
    if processes.is_main:
        cleanup_partial(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")
        logger.info("run directory %s (continue it with 'semrl train --resume %s')", run_dir, run_dir)
    return None


def resolve_dtype(
    cfg: Config,
    resume: bool,
    processes: ProcessGroup,
    probe: Callable[[list[tuple[int, int]]], ProbeResult] = probe_matmuls,
) -> Config:
    """``cfg`` with ``model.dtype: auto`` resolved (``semrl.models.dtype_choice``), before the run
    directory records it. A resumed run keeps the dtype its config.yaml recorded, whatever this
    machine's probe says. The main process probes first and caches; every process then takes
    bfloat16 only if all chose it. ``probe``: the measurement (the tests inject one)."""
    if cfg.model.dtype != "auto":
        return cfg
    recorded = Path(cfg.logging.output_dir) / "config.yaml"
    if resume and recorded.is_file():
        started = (yaml.safe_load(recorded.read_text()) or {}).get("model", {}).get("dtype")
        if started in DTYPES:
            logger.info("model.dtype=auto: %s, as the run recorded when it started (%s)", started, recorded)
            return _with_dtype(cfg, started)
    with processes.state.main_process_first():  # one process converts a GGUF and probes; others read
        path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
        model_config = AutoConfig.from_pretrained(path)
        choice = choose_dtype(
            cfg.rollout.engine, processes.device.type, model_config, cache_root(cfg.model.cache_dir), probe
        )
    dtype = choice.dtype if processes.all_true(choice.dtype == "bfloat16") else "float32"
    logger.info("model.dtype=auto: %s (%s)", dtype, choice.reason)
    return _with_dtype(cfg, dtype)


def _with_dtype(cfg: Config, dtype: str) -> Config:
    """``cfg`` with ``model.dtype`` set to ``dtype`` (one of ``DTYPES``)."""
    model: Any = dataclasses.replace(cfg.model, dtype=cast("Any", dtype))
    return dataclasses.replace(cfg, model=model)


def check_machine(cfg: Config) -> None:
    """Checks of the config that depend on the machine (whether it has CUDA), before models load."""
    if cfg.rollout.engine == "vllm":
        from semrl.rollout.engines.vllm.start import check_vllm_machine

        check_vllm_machine(cfg.rollout)


def check_world_size(cfg: Config, world: int) -> None:
    """Checks that depend on the number of processes, known only once they are started."""
    if cfg.rollout.prompts_per_step % world:
        raise ConfigError(
            f"rollout.prompts_per_step ({cfg.rollout.prompts_per_step}) must be a multiple of the "
            f"number of processes ({world}): each process takes whole prompt groups"
        )
    if cfg.trainer.fsdp and world == 1:
        raise ConfigError(
            "trainer.fsdp shards over processes; start several with 'semrl train --num-processes N'"
        )
    mini = cfg.trainer.mini_batch_size
    if mini is not None and mini % world:
        raise ConfigError(
            f"trainer.mini_batch_size ({mini}) must be a multiple of the number of processes ({world})"
        )


def check_prompt_lengths(tokenizer: PreTrainedTokenizerBase, problems: list[Problem], cfg: Config) -> None:
    """Fail before training when a prompt is over ``data.max_prompt_length`` (the first 1000 checked)."""
    limit, prompt = cfg.data.max_prompt_length, PromptFormat.of(cfg.data)
    for p in problems[:1000]:
        n = len(prompt.ids(tokenizer, p.problem))
        if n > limit:
            raise DataError(
                f"problem '{p.id}' has a {n}-token prompt, over data.max_prompt_length={limit}; "
                "raise data.max_prompt_length or drop the problem"
            )


@dataclass
class Models:
    """The trained model; the one the engine samples from (the trained one, or with FSDP on hf a
    full copy synced after each update); the frozen reference (None when nothing reads it; under
    LoRA the trained model itself, read inside ``reference_weights()``, which switches the adapters
    off)."""

    tokenizer: Any  # a PreTrainedTokenizerBase, whose decode is typed str | list[str]
    model: torch.nn.Module  # a PreTrainedModel, wrapped by FSDP under trainer.fsdp
    rollout_model: PreTrainedModel
    ref_model: PreTrainedModel | None
    engine: Engine
    precision: Precision
    reference_weights: Callable[[], AbstractContextManager[Any]] = nullcontext


def load_models(cfg: Config, model_path: str, processes: ProcessGroup, needs_reference: bool) -> Models:
    """Load the models, shard under FSDP, then build the engine (docs/engines.md, "GPU").

    Under FSDP the model is loaded on the CPU and sharded there: ``fully_shard`` moves one layer at a
    time to the device as it shards it, so the whole model never sits on one GPU. The engine starts
    after that, when the device holds only this process's shard, because vLLM sizes its share from
    the memory free at start-up. With FSDP on vllm the engine takes gathered full tensors, one at a
    time: no second copy of the model. A separate reference model is sharded the same way."""
    m, r = cfg.model, cfg.rollout
    precision = Precision.from_config(cfg)
    tokenizer = load_tokenizer(model_path)
    lora = m.lora_r > 0  # the base from model.name; trained adapters from a checkpoint being resumed
    model = load_model(
        resolve_model_path(m.name, m.cache_dir) if lora else model_path,
        precision.params_name,
        m.attn_implementation,
    )
    if lora:
        add_adapters(model, m, model_path if is_adapter_checkpoint(model_path) else None, cfg.trainer.seed)
    if m.gradient_checkpointing:  # non-reentrant: works under FSDP and with inputs that need no grad
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.trainer.fsdp:
        shard_model(model, precision.fsdp_policy())
    else:
        model.to(processes.device)
    rollout_model = model
    if cfg.trainer.fsdp and r.engine == "hf":
        rollout_model = load_model(model_path, m.dtype, m.attn_implementation)
        rollout_model.requires_grad_(False).eval().to(processes.device)
    # vllm's running batch: one process's rollout (rollout.vllm_max_num_seqs overrides it)
    per_process = r.prompts_per_step // processes.world * r.group_size
    batch = r.generation_batch_size if r.engine == "hf" else per_process
    engine = build_engine(
        r.engine,
        rollout_model,
        tokenizer,
        batch,
        cfg.data.max_prompt_length + r.max_new_tokens,
        r.logprobs_top_k,
        cfg.trainer.seed + processes.rank,
        r,
        compute_dtype=precision.compute,
        # vllm under FSDP: the sharded model's weights reach the engine only gathered
        initial_weights=iter_full_parameters(model) if cfg.trainer.fsdp and rollout_model is model else None,
    )
    check_engine_powers(engine, cfg)
    if engine.compute_dtype != precision.compute and cfg.algorithm.rollout_is == "none":
        logger.warning(
            "the %s engine samples in %s and the trainer computes in %s: their log-probs differ; "
            "algorithm.rollout_is=token corrects for it (docs/algorithms.md, Rollout correction)",
            engine.name,
            str(engine.compute_dtype).removeprefix("torch."),
            str(precision.compute).removeprefix("torch."),
        )
    ref_model = None
    reference_weights: Callable[[], AbstractContextManager[Any]] = nullcontext
    if needs_reference and lora:
        ref_model, reference_weights = model, partial(_base_weights, model, precision)
    elif needs_reference:
        ref_model = load_model(resolve_model_path(m.name, m.cache_dir), m.dtype, m.attn_implementation)
        ref_model.requires_grad_(False).eval()
        if cfg.trainer.fsdp:  # sharded like the trained model: no whole copy on any device
            shard_model(ref_model)
        else:
            ref_model.to(processes.device)
    return Models(tokenizer, model, rollout_model, ref_model, engine, precision, reference_weights)


def check_engine_powers(engine: Engine, cfg: Config) -> None:
    """Refuse, before the first step, a method whose options need an engine power this engine lacks
    (``MethodSpec.engine_powers``), naming the engine and the setting to change."""
    method = get_method(cfg.algorithm.method)
    if method.engine_powers is None:
        return
    for power, setting in method.engine_powers(
        cfg.section(method.section) if method.section else None
    ).items():
        require_power(engine, power, f"algorithm.method={method.name}", setting)


@contextmanager
def _base_weights(model: PreTrainedModel, precision: Precision) -> Iterator[None]:
    """The LoRA reference: ``model`` with its adapters off, in the compute dtype as a separate
    reference would be."""
    with adapters_disabled(model), precision.autocast(model):
        yield


def packing_enabled(cfg: Config, model: torch.nn.Module) -> bool:
    """``trainer.packing=tree`` where tree attention is exact for the model; padded rows otherwise."""
    if cfg.trainer.packing != "tree":
        return False
    if not supports_packing(model):
        logger.warning(
            "trainer.packing=tree: tree attention is not known to be exact for model type '%s' (a sliding "
            "window or soft-capped attention, or an untested architecture); using padded rows",
            getattr(getattr(model, "config", None), "model_type", "?"),
        )
        return False
    return True


def start_trackers(cfg: Config) -> list[Tracker]:
    """The trackers of ``logging.report_to`` for this run (its resolved config included)."""
    lg = cfg.logging
    return open_trackers(lg.report_to, Path(lg.output_dir), cfg.to_dict(), lg.project, lg.run_name)


def stall_watchdog(cfg: Config, engine: str, run_dir: Path, faults: Faults) -> Watchdog:
    """The watchdog of a run's rollouts and evaluations (``rollout.stall_timeout_s``), whose message
    names the checkpoint the run keeps; ``faults.hang``: the phases a test makes stall."""
    return Watchdog(
        cfg.rollout.stall_timeout_s,
        engine,
        "rollout.stall_timeout_s",
        partial(kept_checkpoint, run_dir),
        frozenset(phase(point, step) for point, step in faults.hang),
    )
