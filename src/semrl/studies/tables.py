"""The tables of ``semrl compare``: final held-out (and transfer) metrics as mean +- s.e. (n seeds)
with the base model's row, pass@k for every k, in Markdown and HTML."""

from __future__ import annotations

import html
import logging
from collections.abc import Sequence
from typing import cast

from semrl.studies.comparison import mean_se, value_at_tokens
from semrl.studies.discovery import Run

logger = logging.getLogger(__name__)


def samples_per_problem(groups: dict[str, list[Run]], split: str) -> int:
    ks = [
        int(m.split("@")[1])
        for runs in groups.values()
        for r in runs
        for m in (r.rows[-1] if r.rows else {})
        if m.startswith(f"{split}/mean@")
    ]
    return max(ks, default=0)


def format_mean_se(mean: float, se: float, n: int, digits: int = 3) -> str:
    if n == 0 or mean != mean:
        return ""
    return f"{mean:.{digits}f} ± {se:.{digits}f} ({n})"


def _base_rows(groups: dict[str, list[Run]], split: str) -> dict[int, dict[str, float]]:
    """seed -> the step-0 evaluation row of ``split``: the base model, the same for every variant."""
    base: dict[int, dict[str, float]] = {}
    for runs in groups.values():
        for r in runs:
            first = next((row for row in r.rows if row.get("step") == 0 and f"{split}/problems" in row), None)
            if first is not None:
                base.setdefault(r.seed, first)
    return base


def _base_label(base: dict[int, dict[str, float]], groups: dict[str, list[Run]], split: str) -> str:
    """ "base model (step 0)", saying how many problems it covers where the final evaluations have
    more (``logging.eval_base_problems``) and over how many seeds where not every seed has one
    (``logging.eval_base``)."""
    finals = [r for runs in groups.values() for r in _finished(runs, split)]
    final_sizes = {int(r.final(f"{split}/problems") or 0) for r in finals}
    base_sizes = {int(b.get(f"{split}/problems", 0)) for b in base.values()}
    notes = []
    if base_sizes and final_sizes and max(base_sizes) < max(final_sizes):
        notes.append(f"{'/'.join(map(str, sorted(base_sizes)))} of {max(final_sizes)} problems")
    seeds = {r.seed for r in finals}
    if seeds - set(base):
        notes.append(f"seeds {', '.join(map(str, sorted(base)))} only")
    return "base model (step 0" + "".join(f", {n}" for n in notes) + ")"


def _finished(runs: Sequence[Run], split: str) -> list[Run]:
    """The runs with an evaluation of ``split`` after training (their final one is read)."""
    return [r for r in runs if r.eval_steps(split) and r.eval_steps(split)[-1] > 0]


def final_metrics(groups: dict[str, list[Run]], split: str) -> list[str]:
    """The evaluation metrics of ``split`` that the final tables and comparisons report."""
    n = samples_per_problem(groups, split)
    if not n:
        return []
    ks = sorted({1, 2, 4, 8, 16, n} & set(range(1, n + 1)))
    return [
        f"{split}/{m}"
        for m in [
            f"mean@{n}",
            *(f"pass@{k}" for k in ks),
            f"maj@{n}",
            "response_length",
            "response_length/correct",
            "distinct_answers",
            "truncated_frac",
        ]
    ]


def final_table(
    groups: dict[str, list[Run]], split: str, budget: float | None = None
) -> tuple[list[str], list[list[str]]]:
    """Header and rows: the base model (step 0, over every seed that evaluated it) and each variant's
    final evaluation, mean ± s.e. (n seeds); with ``budget``, each run's value at that many sampled
    tokens (``value_at_tokens``)."""
    metrics = final_metrics(groups, split)
    if not metrics:
        return [], []
    header = ["variant", *(m.split("/", 1)[1] for m in metrics)]
    base = _base_rows(groups, split)
    rows = []
    if base:
        rows.append(
            [
                _base_label(base, groups, split),
                *(format_mean_se(*mean_se([b[m] for b in base.values() if m in b])) for m in metrics),
            ]
        )
    for variant, runs in groups.items():
        finals = _finished(runs, split)
        cells = [
            format_mean_se(
                *mean_se(
                    [
                        v
                        for r in finals
                        if (v := r.final(m) if budget is None else value_at_tokens(r, m, budget)) is not None
                    ]
                )
            )
            for m in metrics
        ]
        rows.append([variant, *cells])
    return header, rows


def pass_at_k_curves(
    groups: dict[str, list[Run]], split: str
) -> dict[str, list[tuple[int, float, float, int]]]:
    """name -> (k, mean, s.e., n seeds) for k = 1..n: the base model (step 0) and each variant's
    final evaluation."""
    n = samples_per_problem(groups, split)
    curves: dict[str, list[tuple[int, float, float, int]]] = {}
    base = _base_rows(groups, split)
    if base:
        curves["base model"] = [
            (k, *mean_se([b[f"{split}/pass@{k}"] for b in base.values()])) for k in range(1, n + 1)
        ]
    for variant, runs in groups.items():
        finals = _finished(runs, split)
        if finals:
            curves[variant] = [
                (k, *mean_se([cast(float, r.final(f"{split}/pass@{k}")) for r in finals]))
                for k in range(1, n + 1)
            ]
    return curves


def markdown_lines(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines: the header, its rule and one line per row."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
