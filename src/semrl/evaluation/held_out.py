"""Evaluation during training: the held-out and transfer splits at a step, cached across runs that
would sample them identically (``logging.eval_cache``), records in ``RUN_DIR/eval``."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from semrl.config.held_out_settings import HOW_SAMPLED_AND_JUDGED, WHAT_SAMPLES, setting
from semrl.core.atomic import write_text_atomic
from semrl.core.jsonl import log_exists, read_jsonl
from semrl.data import Problem
from semrl.data.prompts import PromptFormat
from semrl.evaluation.metrics import summarize_records
from semrl.evaluation.sampling import sample_and_verify
from semrl.reward import Judge, RewardFunctions, VerifierPool
from semrl.rollout.engines import Engine, sampling_params
from semrl.tracking.progress import Progress

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from semrl.config.sections import Config
    from semrl.core.distributed import ProcessGroup

logger = logging.getLogger(__name__)


EVAL_SPLITS = ("eval", "transfer")  # metric prefixes: held-out problems, problems of a kind never trained on


def evaluation_key(cfg: Config, problems: Sequence[Problem], split: str, world: int) -> dict[str, Any]:
    """Everything that decides the samples of an in-training evaluation of the model named by
    ``model.name`` (before any update): runs with equal keys sample the same responses, so the
    base model's evaluation is computed once and reused (``logging.eval_cache``). The weights are
    keyed by their files (name, size, modification time), the problems by their ids, texts and
    answers, the verdicts by the reward functions."""
    return {
        "split": split,
        "weights": weights_fingerprint(cfg.model.name),
        "world": world,
        **{field: _plain(setting(cfg, section, key)) for field, section, key in WHAT_SAMPLES},
        **{field: _plain(setting(cfg, section, key)) for field, section, key in HOW_SAMPLED_AND_JUDGED},
        # the restatement rule's version: 2 compares trees (issue 90), 1 compared text
        "restatement_rule": 2 if cfg.reward.refuse_restatements else None,
        "problems": hashlib.sha256(
            json.dumps([[p.id, p.problem, p.answer] for p in problems]).encode()
        ).hexdigest(),
    }


def _plain(value: Any) -> Any:
    """A setting as JSON holds it: a tuple or list as a list."""
    return list(value) if isinstance(value, tuple | list) else value


def weights_fingerprint(name: str) -> list[tuple[str, int, int]]:
    """(file name, size, modification time in ns) of each file that holds the weights of ``model.name``
    (the alias's GGUF, a .gguf file, or a model directory's files); [] for a hub id."""
    from semrl.models.loading import SMOLLM2_ALIAS, smollm2_gguf_path

    path = smollm2_gguf_path() if name == SMOLLM2_ALIAS else Path(name).expanduser()
    if path.is_dir():
        files = sorted(f for f in path.iterdir() if f.is_file())
    else:
        files = [path] if path.exists() else []
    return [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]


def _cache_file(cache_dir: str | Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return Path(cache_dir) / f"{key['split']}-{digest}.jsonl"


def records_path(run_dir: str | Path, split: str, step: int) -> Path:
    """Where a run keeps the problem records of its evaluation of ``split`` at ``step``."""
    return Path(run_dir) / "eval" / f"{split}-step-{step:06d}.jsonl"


def evaluate_held_out(
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase,
    pool: VerifierPool,
    problems: Sequence[Problem],
    cfg: Config,
    processes: ProcessGroup,
    *,
    split: str = "eval",
    step: int = 0,
    run_dir: str | Path | None = None,
    functions: RewardFunctions | None = None,
) -> dict[str, float]:
    """In-training evaluation: ``logging.eval_samples`` samples per problem at the evaluation
    temperature, judged by ``functions`` (the run's reward functions; ``sample_and_verify``),
    metrics as ``{split}/...`` (``summarize_records``). Each process samples every N-th
    problem; the main process gets the records, writes them to ``records_path(run_dir, split, step)``
    and returns the metrics (the others: {}). At step 0 with ``logging.eval_cache`` set, records of an
    identical earlier evaluation (``evaluation_key``) are reused instead of sampled."""
    log = cfg.logging
    cached = None
    if step == 0 and log.eval_cache:
        key = evaluation_key(cfg, problems, split, processes.world)
        cached = _cache_file(log.eval_cache, key)
        if processes.all_true(log_exists(cached)):
            records = read_jsonl(cached) if processes.is_main else []
            return _finish_evaluation(records, split, step, run_dir, processes)
    # A separate generator: evaluation must not change the training random stream.
    offset = EVAL_SPLITS.index(split) * 104_729 if split in EVAL_SPLITS else 0
    gen = torch.Generator().manual_seed(cfg.trainer.seed + 1 + 7919 * processes.rank + offset)
    share = problems[processes.rank :: processes.world]
    with Progress(
        len(share) * log.eval_samples, split, "sample", log.progress and processes.is_main, leave=False
    ) as bar:
        records = [
            s.record()
            for s in sample_and_verify(
                engine,
                tokenizer,
                share,
                sampling_params(cfg.rollout, log.eval_temperature, top_logprobs=False),
                log.eval_samples,
                PromptFormat.of(cfg.data),
                Judge(pool, cfg.reward.final_number_fallback, functions),
                gen,
                bar.update,
            )
        ]
        if bar.plain:  # no terminal for a bar: one line per evaluation
            samples = len(share) * log.eval_samples
            logger.info("%s after step %d: %d samples in %.1f s", split, step, samples, bar.seconds())
    shares = processes.gather(records)
    # back in the problems' order (process r sampled problems r, r + world, ...)
    records = []
    if processes.is_main:
        records = [shares[i % processes.world][i // processes.world] for i in range(len(problems))]
    if cached is not None and processes.is_main:
        write_text_atomic(cached, "".join(json.dumps(r) + "\n" for r in records))
        write_text_atomic(cached.with_suffix(".key.json"), json.dumps(key, indent=2))
    return _finish_evaluation(records, split, step, run_dir, processes)


def evaluate_splits(
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase,
    pool: VerifierPool,
    splits: Mapping[str, Sequence[Problem]],
    cfg: Config,
    processes: ProcessGroup,
    step: int,
    run_dir: str | Path,
    functions: RewardFunctions | None = None,
) -> dict[str, float]:
    """``evaluate_held_out`` of each split (``{"eval": held-out, "transfer": ...}``), metrics merged,
    with the wall time of each split's evaluation (``time/eval_s/{split}``, a reused base evaluation
    included) and of all (``time/eval_s``) on the main process."""
    out: dict[str, float] = {}
    times: dict[str, float] = {}
    for split, problems in splits.items():
        start = time.perf_counter()
        out.update(
            evaluate_held_out(
                engine,
                tokenizer,
                pool,
                problems,
                cfg,
                processes,
                split=split,
                step=step,
                run_dir=run_dir,
                functions=functions,
            )
        )
        times[f"time/eval_s/{split}"] = time.perf_counter() - start
    if processes.is_main and times:
        out.update(times)
        out["time/eval_s"] = sum(times.values())
    return out


def _finish_evaluation(
    records: list[dict[str, Any]], split: str, step: int, run_dir: str | Path | None, processes: ProcessGroup
) -> dict[str, float]:
    if not processes.is_main:
        return {}
    if run_dir is not None:
        write_text_atomic(records_path(run_dir, split, step), "".join(json.dumps(r) + "\n" for r in records))
    return {f"{split}/{k}": v for k, v in summarize_records(records).items()}
