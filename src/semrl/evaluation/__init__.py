"""Evaluation: unbiased pass@k (Chen et al. 2021), mean@k, maj@k, lengths, distinct answers.

A *problem record* (one JSON line of ``problems.jsonl``) holds a problem's n samples::

    {"id", "gold", "level", "subject",
     "samples": [{"response", "answer", "correct", "length", "truncated", "timed_out", "cluster"}]}

``cluster`` numbers the sample's answer-equivalence class within the problem (math-verify, as the
semantic entropy of ``semrl.methods.semantic_entropy``); a sample without an answer is its own class.
Metric definitions: docs/algorithms.md "Evaluation metrics".
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from semrl.core.atomic import write_text_atomic
from semrl.core.jsonl import log_exists, read_jsonl
from semrl.data import Problem
from semrl.data.prompts import PromptFormat
from semrl.methods.semantic_entropy import cluster_answers
from semrl.reward import Judge, RewardFunctions, RewardResult, VerifierPool, score_responses
from semrl.rollout.engines import Engine, Generation, GenerationRequest, SamplingParams, sampling_params

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from semrl.config.sections import Config
    from semrl.core.distributed import ProcessGroup


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from c correct out of n:
    ``1 - C(n-c, k) / C(n, k)``, computed as a stable product; 1 when ``n - c < k``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def maj_at_k(clusters: Sequence[int], correct: Sequence[bool], has_answer: Sequence[bool], k: int) -> float:
    """Majority-vote accuracy over the first k samples of one problem.

    Samples without an answer do not vote. Ties are split: when t answer classes share the top
    count, the problem scores (number of correct classes among them) / t, the expected accuracy of
    breaking the tie uniformly at random. A class is correct when any of its samples is (its
    members are equivalent answers).
    """
    if not 1 <= k <= len(clusters):
        raise ValueError(f"need 1 <= k <= {len(clusters)} samples, got k={k}")
    votes: dict[int, int] = {}
    right: dict[int, bool] = {}
    for cluster, ok, answered in zip(clusters[:k], correct[:k], has_answer[:k], strict=True):
        if answered:
            votes[cluster] = votes.get(cluster, 0) + 1
            right[cluster] = right.get(cluster, False) or ok
    if not votes:
        return 0.0
    top = max(votes.values())
    leaders = [c for c, v in votes.items() if v == top]
    return sum(right[c] for c in leaders) / len(leaders)


def report_ks(n: int) -> list[int]:
    """The k shown in tables: 1, 2, 4, ... and n (every k <= n is in the JSON)."""
    return sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})


def summarize_records(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Flat metrics over problem records that all have the same number of samples n:
    ``mean@n``, ``pass@k`` and ``maj@k`` for every k <= n, response length (all and correct),
    truncation rate, distinct answers per problem and verification time-outs."""
    if not records:
        raise ValueError("no problem records to summarize")
    n = len(records[0]["samples"])
    if n == 0 or any(len(r["samples"]) != n for r in records):
        raise ValueError("every problem needs the same, non-zero number of samples")
    counts = [sum(s["correct"] for s in r["samples"]) for r in records]
    samples = [s for r in records for s in r["samples"]]
    lengths = np.array([s["length"] for s in samples], dtype=float)
    correct = np.array([s["correct"] for s in samples], dtype=bool)
    out: dict[str, float] = {"problems": float(len(records)), f"mean@{n}": float(np.mean(counts) / n)}
    for k in range(1, n + 1):
        out[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in counts]))
    votes = [  # per problem: (answer classes, correct, has an answer) of its samples
        (
            [s["cluster"] for s in r["samples"]],
            [s["correct"] for s in r["samples"]],
            [s["answer"] is not None for s in r["samples"]],
        )
        for r in records
    ]
    for k in range(1, n + 1):
        out[f"maj@{k}"] = float(np.mean([maj_at_k(*v, k) for v in votes]))
    out["response_length"] = float(lengths.mean())
    out["response_length/correct"] = float(lengths[correct].mean()) if correct.any() else 0.0
    out["truncated_frac"] = float(np.mean([s["truncated"] for s in samples]))
    out["distinct_answers"] = float(
        np.mean([len({s["cluster"] for s in r["samples"] if s["answer"] is not None}) for r in records])
    )
    out["verify_timeouts"] = float(sum(s["timed_out"] for s in samples))
    return out


def summarize_by(records: Sequence[dict[str, Any]], field: str) -> dict[str, dict[str, float]]:
    """``summarize_records`` per value of ``field`` ('level' or 'subject'); empty when no record
    has the field."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get(field) is not None:
            groups.setdefault(str(r[field]), []).append(r)
    return {key: summarize_records(groups[key]) for key in sorted(groups, key=_natural_key)}


def _natural_key(text: str) -> tuple[int, Any]:
    return (0, int(text)) if text.lstrip("-").isdigit() else (1, text)


@dataclass
class SampledProblem:
    """``num_samples`` responses to one problem, verified against its answer and clustered by answer
    equivalence; lists of length ``num_samples``."""

    problem: Problem
    generations: list[Generation]
    texts: list[str]
    rewards: list[RewardResult]  # extracted answer and correctness of each response
    clusters: list[int]  # each answer's equivalence class (semrl.methods.semantic_entropy.cluster_answers)

    def record(self) -> dict[str, Any]:
        """Its problem record (module docstring)."""
        return {
            "id": self.problem.id,
            "gold": self.problem.answer,
            "level": self.problem.level,
            "subject": self.problem.subject,
            "samples": [
                {
                    "response": text,
                    "answer": reward.answer,
                    "correct": reward.correct,
                    "length": len(gen.token_ids),
                    "truncated": gen.truncated,
                    "timed_out": reward.timed_out,
                    "cluster": cluster,
                }
                for gen, text, reward, cluster in zip(
                    self.generations, self.texts, self.rewards, self.clusters, strict=True
                )
            ],
        }


def sample_and_verify(
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    params: SamplingParams,
    num_samples: int,
    prompt: PromptFormat,
    judge: Judge,
    generator: torch.Generator | None = None,
    progress: Callable[[int], Any] | None = None,
) -> list[SampledProblem]:
    """Sample ``num_samples`` responses per problem (prompts in ``prompt``'s format, as in training),
    judge them with ``judge`` and cluster their answers: what evaluation and the SENT curriculum's
    scoring both need.

    An engine that refills finished slots (``Engine.continuous_batching``: vllm) gets every request
    at once (``Engine.generate_dynamic``); the others get chunks of ``engine.batch_size``. Either
    way the requests take their seeds from ``generator`` in the same order, so the samples do not
    depend on the path (docs/evaluation.md, "Continuous batching"). ``progress`` gets a count for
    every finished sample as it finishes, also inside a chunk; a problem is judged as soon as its last
    sample finishes (at the end of its chunk on a chunked engine)."""
    prompt_ids = [prompt.ids(tokenizer, p.problem) for p in problems]
    tagged = [
        ((i, j), GenerationRequest(ids)) for i, ids in enumerate(prompt_ids) for j in range(num_samples)
    ]
    gens: list[list[Generation | None]] = [[None] * num_samples for _ in problems]
    waiting = [num_samples] * len(problems)
    out: list[SampledProblem | None] = [None] * len(problems)

    def finished(tag: tuple[int, int], request: GenerationRequest, generation: Generation) -> list[Any]:
        i, j = tag
        gens[i][j] = generation
        waiting[i] -= 1
        if progress is not None and engine.continuous_batching:  # the others count as rows stop
            progress(1)
        if waiting[i] == 0:
            done = [g for g in gens[i] if g is not None]
            out[i] = _judged(problems[i], done, tokenizer, judge)
        return []

    if engine.continuous_batching:
        engine.generate_dynamic(tagged, params, generator, finished)
    else:
        for start in range(0, len(tagged), engine.batch_size):
            chunk = tagged[start : start + engine.batch_size]
            generations = engine.generate([r for _, r in chunk], params, generator, on_finished=progress)
            for (tag, request), generation in zip(chunk, generations, strict=True):
                finished(tag, request, generation)
    return [s for s in out if s is not None]


def _judged(
    problem: Problem, gens: list[Generation], tokenizer: PreTrainedTokenizerBase, judge: Judge
) -> SampledProblem:
    """One problem's samples decoded, judged and clustered by answer equivalence."""
    pool, functions, final_number_fallback = judge.pool, judge.functions, judge.final_number_fallback
    # decode is typed str | list[str]; one sequence of ids gives a str
    texts: list[str] = [tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in gens]  # type: ignore[misc]
    if functions is None:
        golds = [problem.answer] * len(gens)
        rewards = score_responses(pool, texts, golds, final_number_fallback=final_number_fallback)
    else:
        from semrl.data import problem_columns

        rewards, _ = functions.score(
            pool,
            [problem.problem] * len(gens),
            texts,
            [g.token_ids.tolist() for g in gens],
            [problem_columns(problem)] * len(gens),
            final_number_fallback=final_number_fallback,
        )
    clusters = cluster_answers(
        [r.answer for r in rewards], lambda a, b: pool.verify_many([(a, b)])[0].correct
    )
    return SampledProblem(problem, gens, texts, rewards, clusters)


# ----------------------------------------------------------------------------------------------
# Resumable evaluation of a dataset into a directory


@dataclass(frozen=True)
class EvalSettings:
    """Everything that decides the samples; a resumed evaluation must match it exactly."""

    model: str
    dataset: str
    num_samples: int
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    system_prompt: str | None
    final_number_fallback: bool
    problems_per_chunk: int
    batch_size: int
    prompt_template: str | None = None
    numeral_answers: bool = True  # the pool's rule (reward.numeral_answers); files before it: false


# Named sampling settings of the papers (ecosystem.md section 3).
PRESETS: dict[str, dict[str, Any]] = {
    "rose": {"n": 8, "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 4096},
    "sent": {"n": 1, "temperature": 1.0, "top_p": 0.6, "max_new_tokens": 3000},
    "greedy": {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 3000},
    "aime64": {"n": 64, "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 4096},
}


def _settings_to_resume(out_dir: Path, settings: EvalSettings, pool: VerifierPool) -> dict[str, Any]:
    """``settings`` as written in ``out_dir/settings.json``: written there if new, else checked
    against what is there (a resumed evaluation must match exactly); the pool must judge by them."""
    if pool.numeral_answers != settings.numeral_answers:
        raise ValueError(
            f"the verifier pool has numeral_answers={pool.numeral_answers} and the evaluation settings "
            f"{settings.numeral_answers}: build both from the same reward.numeral_answers"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    settings_file = out_dir / "settings.json"
    wanted = asdict(settings)
    if settings_file.exists():
        # older files lack the later keys; their verdicts came from math-verify alone
        found = {"prompt_template": None, "numeral_answers": False, **json.loads(settings_file.read_text())}
        if found != wanted:
            diff = {k: (found.get(k), v) for k, v in wanted.items() if found.get(k) != v}
            raise ValueError(
                f"{out_dir} holds an evaluation with other settings {diff} (found, asked); "
                "pass a new --output directory or delete that one to start over"
            )
    else:
        settings_file.write_text(json.dumps(wanted, indent=2))
    return wanted


def evaluate_dataset(
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase,
    pool: VerifierPool,
    problems: Sequence[Problem],
    settings: EvalSettings,
    out_dir: Path,
    progress: Callable[[int], Any] | None = None,
) -> tuple[dict[str, Any], int]:
    """Evaluate ``problems`` into ``out_dir`` (``settings.json``, ``problems.jsonl``,
    ``summary.json``), resuming: problems already in ``problems.jsonl`` are reused.

    Problems are sampled in fixed chunks of ``settings.problems_per_chunk``, chunk i with seed
    ``settings.seed + i``, so a resumed evaluation gives the same samples as an uninterrupted one.
    Returns (summary, number of problems reused); the summary has ``metrics``, ``by_level`` and
    ``by_subject``. ``progress`` gets sample counts as samples finish, reused ones included.
    """
    seen: set[str] = set()
    for p in problems:
        if p.id in seen:
            raise ValueError(f"dataset '{settings.dataset}' has the id '{p.id}' twice; ids must be unique")
        seen.add(p.id)
    wanted = _settings_to_resume(out_dir, settings, pool)
    records_file = out_dir / "problems.jsonl"
    done = {r["id"]: r for r in read_jsonl(records_file)}
    reused = sum(p.id in done for p in problems)
    # rewrite without any torn line before appending
    records_file.write_text("".join(json.dumps(r) + "\n" for r in done.values()), encoding="utf-8")
    params = SamplingParams(
        settings.temperature, settings.top_p, 0, settings.max_new_tokens, logprobs_top_k=0
    )
    size = settings.problems_per_chunk
    for chunk, start in enumerate(range(0, len(problems), size)):
        todo = [p for p in problems[start : start + size] if p.id not in done]
        if not todo:
            if progress is not None:
                progress(len(problems[start : start + size]) * settings.num_samples)
            continue
        if len(todo) < len(problems[start : start + size]):
            todo = list(problems[start : start + size])  # a partly written chunk: redo it whole
        generator = torch.Generator().manual_seed(settings.seed + chunk)
        records = [
            s.record()
            for s in sample_and_verify(
                engine,
                tokenizer,
                todo,
                params,
                settings.num_samples,
                PromptFormat(settings.system_prompt, settings.prompt_template),
                Judge(pool, settings.final_number_fallback),
                generator,
                progress,
            )
        ]
        new = [r for r in records if r["id"] not in done]
        with records_file.open("a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in new))
        done.update((r["id"], r) for r in new)
    ordered = [done[p.id] for p in problems]
    summary = {
        "settings": wanted,
        "metrics": summarize_records(ordered),
        "by_level": summarize_by(ordered, "level"),
        "by_subject": summarize_by(ordered, "subject"),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary, reused


def evaluate_datasets(
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase,
    pool: VerifierPool,
    problems: Mapping[str, Sequence[Problem]],
    settings: dict[str, EvalSettings],
    output: Path,
    title: str,
    quiet: bool = False,
) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """``semrl eval``: each named dataset evaluated into ``output/NAME`` (``evaluate_dataset``,
    resumable), then ``output/metrics.json`` and ``output/results.md`` (under ``title``) written.
    Returns the summaries and, per dataset, the problems reused from an earlier run."""
    summaries, reused = {}, {}
    for name, dataset in problems.items():
        total = len(dataset) * settings[name].num_samples
        with tqdm(total=total, desc=f"eval {name}", unit="sample", disable=quiet) as bar:
            summaries[name], reused[name] = evaluate_dataset(
                engine, tokenizer, pool, dataset, settings[name], output / name, bar.update
            )
    write_text_atomic(output / "metrics.json", json.dumps(summaries, indent=2))
    write_text_atomic(output / "results.md", f"# {title}\n\n{markdown_table(summaries)}\n")
    return summaries, reused


def markdown_table(summaries: dict[str, dict[str, Any]]) -> str:
    """One row per dataset: pass@k for k in ``report_ks(n)``, maj@n, lengths, distinct answers,
    time-outs; then a table per dataset with levels or subjects."""

    def row_cells(metrics: dict[str, float], n: int) -> list[str]:
        cells = [f"{int(metrics['problems'])}", f"{metrics[f'mean@{n}']:.3f}"]
        cells += [f"{metrics[f'pass@{k}']:.3f}" for k in report_ks(n)]
        cells += [
            f"{metrics[f'maj@{n}']:.3f}",
            f"{metrics['response_length']:.1f}",
            f"{metrics['response_length/correct']:.1f}",
            f"{metrics['distinct_answers']:.2f}",
            f"{int(metrics['verify_timeouts'])}",
        ]
        return cells

    def header(first: str, n: int) -> list[str]:
        cols = [first, "problems", f"mean@{n}", *(f"pass@{k}" for k in report_ks(n)), f"maj@{n}"]
        cols += ["length", "length (correct)", "distinct answers", "time-outs"]
        return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]

    lines: list[str] = []
    by_n: dict[int, list[str]] = {}
    for name, summary in summaries.items():
        by_n.setdefault(summary["settings"]["num_samples"], []).append(name)
    for n, names in by_n.items():
        lines += header("dataset", n)
        lines += [
            "| " + " | ".join([name, *row_cells(summaries[name]["metrics"], n)]) + " |" for name in names
        ]
        lines.append("")
    for name, summary in summaries.items():
        n = summary["settings"]["num_samples"]
        for field in ("level", "subject"):
            groups = summary[f"by_{field}"]
            if len(groups) > 1:
                lines.append(f"**{name} by {field}**")
                lines.append("")
                lines += header(field, n)
                lines += ["| " + " | ".join([key, *row_cells(m, n)]) + " |" for key, m in groups.items()]
                lines.append("")
    return "\n".join(lines)


EVAL_SPLITS = ("eval", "transfer")  # metric prefixes: held-out problems, problems of a kind never trained on


def evaluation_key(cfg: Config, problems: Sequence[Problem], split: str, world: int) -> dict[str, Any]:
    """Everything that decides the samples of an in-training evaluation of the model named by
    ``model.name`` (before any update): runs with equal keys sample the same responses, so the
    base model's evaluation is computed once and reused (``logging.eval_cache``). The weights are
    keyed by their files (name, size, modification time), the problems by their ids, texts and
    answers, the verdicts by the reward functions."""
    model, rollout, log = cfg.model, cfg.rollout, cfg.logging
    return {
        "split": split,
        "model": model.name,
        "weights": weights_fingerprint(model.name),
        "dtype": model.dtype,
        "master_weights": model.master_weights,
        "lora_r": model.lora_r,
        "attn_implementation": model.attn_implementation,
        "engine": rollout.engine,
        "generation_batch_size": rollout.generation_batch_size,
        "vllm_block_size": rollout.vllm_block_size,
        "vllm_dtype": rollout.vllm_dtype,
        "vllm_max_num_seqs": rollout.vllm_max_num_seqs,
        "vllm_max_num_batched_tokens": rollout.vllm_max_num_batched_tokens,
        "temperature": log.eval_temperature,
        "rollout_temperature": rollout.temperature,
        "top_p": rollout.top_p,
        "top_k": rollout.top_k,
        "max_new_tokens": rollout.max_new_tokens,
        "samples": log.eval_samples,
        "seed": cfg.trainer.seed,
        "world": world,
        "system_prompt": cfg.data.system_prompt,
        "prompt_template": cfg.data.prompt_template,
        "final_number_fallback": cfg.reward.final_number_fallback,
        "reward_functions": list(cfg.reward.functions),
        "correctness": cfg.reward.correctness,
        "reward_timeout_s": cfg.reward.timeout_s,
        "numeral_answers": cfg.reward.numeral_answers,
        "problems": hashlib.sha256(
            json.dumps([[p.id, p.problem, p.answer] for p in problems]).encode()
        ).hexdigest(),
    }


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
    with tqdm(
        total=len(share) * log.eval_samples,
        desc=split,
        unit="sample",
        leave=False,
        disable=not (log.progress and processes.is_main),
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
