"""``semrl eval``: a resumable evaluation of datasets into a directory (``problems.jsonl`` per
dataset, a summary, a Markdown table), with the settings that decide the samples checked on resume."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from semrl.core.atomic import write_text_atomic
from semrl.core.jsonl import read_jsonl
from semrl.data import Problem
from semrl.data.prompts import PromptFormat
from semrl.evaluation.metrics import report_ks, summarize_by, summarize_records
from semrl.evaluation.sampling import sample_and_verify
from semrl.reward import Judge, VerifierPool
from semrl.rollout.engines import Engine, SamplingParams
from semrl.tracking.progress import Progress

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


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
    refuse_restatements: bool = True  # the pool's rule (reward.refuse_restatements); before it: false


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
    for rule in ("numeral_answers", "refuse_restatements"):
        if getattr(pool, rule) != getattr(settings, rule):
            raise ValueError(
                f"the verifier pool has {rule}={getattr(pool, rule)} and the evaluation settings "
                f"{getattr(settings, rule)}: build both from the same reward.{rule}"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    settings_file = out_dir / "settings.json"
    wanted = asdict(settings)
    if settings_file.exists():
        # older files lack the later keys; their verdicts came from math-verify alone
        found = {
            "prompt_template": None,
            "numeral_answers": False,
            "refuse_restatements": False,
            **json.loads(settings_file.read_text()),
        }
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
        with Progress(total, f"eval {name}", "sample", not quiet) as bar:
            summaries[name], reused[name] = evaluate_dataset(
                engine, tokenizer, pool, dataset, settings[name], output / name, bar.update
            )
            if bar.plain:  # no terminal for a bar: one line per dataset
                logger.info("eval %s: %d samples in %.1f s", name, total, bar.seconds())
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
