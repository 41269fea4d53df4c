"""``semrl compare``: comparing variants across seeds, written out (docs/sweeps.md describes the
output). Each part has its own module:

- finding the runs, a sweep directory (``OUT/VARIANT/seed-S``) or run directories grouped by a
  config key: ``semrl.studies.discovery``;
- per-step means and standard errors, paired differences at the seed level, decision rules at a
  design's looks, the compute axis: ``semrl.studies.comparison``;
- the final tables and pass@k: ``semrl.studies.tables``; the curves: ``semrl.studies.figures``.

This module assembles them into ``aggregate.json``, ``summary.md``, ``summary.html`` and the figures.
"""

from __future__ import annotations

import base64
import html
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from semrl.studies.comparison import (
    COMPARISON_HEADER,
    Section,
    aggregate,
    comparison_pairs,
    comparison_rows,
    cumulative_tokens,
    decide_all,
    decision_forest,
    design_section,
    equal_token_budget,
    mean_se,
    per_step,
    value_at_tokens,
)
from semrl.studies.decide import (
    DECISION_HEADER,
    Hypothesis,
    decision_rows,
    decision_summary,
)
from semrl.studies.designs import LOOKS_LOG
from semrl.studies.discovery import CURVE_METRICS, SPLITS, Run, find_runs
from semrl.studies.figures import draw_curves
from semrl.studies.forest import ForestRow, draw_forest
from semrl.studies.rules_file import RulesFile
from semrl.studies.tables import (
    final_metrics,
    final_table,
    format_mean_se,
    html_table,
    markdown_lines,
    pass_at_k_curves,
    samples_per_problem,
)

logger = logging.getLogger(__name__)


def _split_sections(
    groups: dict[str, list[Run]], split: str, pairs: list[tuple[str, str]], budget: float | None
) -> list[Section]:
    """The final tables of one evaluation split: the final metrics, pass@k for every k and the paired
    differences, at equal steps and, with ``budget``, at equal sampled tokens."""
    header, rows = final_table(groups, split)
    if not rows:
        return []
    title = "Held-out problems" if split == "eval" else "Transfer split"
    n = samples_per_problem(groups, split)
    curve = pass_at_k_curves(groups, split)
    sections: list[Section] = [
        (f"{title}: final evaluation, mean ± s.e. (n seeds)", header, rows),
        (
            f"{title}: pass@k for k = 1..{n}, mean ± s.e.",
            ["k", *curve],
            [[str(k), *(format_mean_se(*pts[k - 1][1:]) for pts in curve.values())] for k in range(1, n + 1)],
        ),
    ]
    # a held-out value at equal tokens is read between two real evaluations: with only the ones
    # before and after training it would be a straight line between them, so it is not shown
    between = budget is not None and _evaluated_during_training(groups, split)
    note = (
        ""
        if budget is None or between
        else ("; none at equal sampled tokens: the runs evaluated only before and after training")
    )
    if rows := comparison_rows(groups, pairs, final_metrics(groups, split), prefix=f"{split}/"):
        sections.append(
            (
                f"{title}: paired differences at equal steps (over seeds; 95% t-interval{note})",
                COMPARISON_HEADER,
                rows,
            )
        )
    if between:
        read = "read linearly between the evaluations around it"
        header, rows = final_table(groups, split, budget)
        sections.append(
            (f"{title}: at equal sampled tokens ({budget:,.0f}; {read}), mean ± s.e.", header, rows)
        )
        if rows := comparison_rows(groups, pairs, final_metrics(groups, split), budget, f"{split}/"):
            sections.append(
                (
                    f"{title}: paired differences at equal sampled tokens ({budget:,.0f}; {read}; "
                    "95% t-interval)",
                    COMPARISON_HEADER,
                    rows,
                )
            )
    return sections


def _evaluated_during_training(groups: dict[str, list[Run]], split: str) -> bool:
    """Whether every run evaluated ``split`` at some step between its first and its last."""
    runs = [r for group in groups.values() for r in group]

    def steps(run: Run) -> set[Any]:
        return {row.get("step") for row in run.rows if any(k.startswith(f"{split}/") for k in row)}

    return bool(runs) and all(len(steps(r)) > 2 for r in runs)


def _training_sections(
    groups: dict[str, list[Run]],
    pairs: list[tuple[str, str]],
    metrics: list[str],
    budget: float | None,
    window: int,
) -> list[Section]:
    """Paired differences of the training metrics (at the last step or window, and with ``budget``
    at equal sampled tokens), the sampled tokens, and each metric per step."""
    sections: list[Section] = []
    last_step = [m for m in metrics if any(r.series(m) for runs in groups.values() for r in runs)]
    if rows := comparison_rows(groups, pairs, last_step, window=window):
        where = "at the last step" if window == 1 else f"over the last {window} steps (mean)"
        heading = f"Training metrics {where}: paired differences (95% t-interval)"
        sections.append((heading, COMPARISON_HEADER, rows))
    if budget is not None:
        at_budget = [
            [
                v,
                *(
                    format_mean_se(
                        *mean_se([x for r in runs if (x := value_at_tokens(r, m, budget)) is not None])
                    )
                    for m in last_step
                ),
            ]
            for v, runs in groups.items()
        ]
        where = f"at equal sampled tokens ({budget:,.0f})"
        sections.append(
            (f"Training metrics {where}, mean ± s.e. (n seeds)", ["variant", *last_step], at_budget)
        )
        if rows := comparison_rows(groups, pairs, last_step, budget):
            heading = f"Training metrics {where}: paired differences (95% t-interval)"
            sections.append((heading, COMPARISON_HEADER, rows))
        tokens_row = [
            [v, format_mean_se(*mean_se([max(cumulative_tokens(r).values()) for r in runs]), digits=0)]
            for v, runs in groups.items()
        ]
        sections.append(("Sampled tokens in all, mean ± s.e. (n seeds)", ["variant", "tokens"], tokens_row))
    for metric in metrics:
        lines = {v: {p[0]: p for p in per_step(runs, metric) if p[0] > 0} for v, runs in groups.items()}
        if steps := sorted({s for pts in lines.values() for s in pts}):
            rows = [
                [str(s), *(format_mean_se(*pts[s][1:]) if s in pts else "" for pts in lines.values())]
                for s in steps
            ]
            sections.append((f"{metric} per step, mean ± s.e. (n seeds)", ["step", *lines], rows))
    return sections


def _write_outputs(
    out: Path,
    groups: dict[str, list[Run]],
    title: str,
    sections: list[Section],
    md: list[str],
    metrics: list[str],
    x_axis: str,
    forest: Sequence[ForestRow] = (),
) -> list[str]:
    """``results.md`` (``md`` and the figures), ``aggregate.json``, the PNG figures (first the
    decisions' forest plot, with ``forest``) and a self-contained ``index.html`` in ``out``; returns
    ``md`` with the figures and what was written."""
    out.mkdir(parents=True, exist_ok=True)
    decisions = draw_forest(forest, out / "figures" / "decisions.png", sections[0][0]) if forest else None
    figures = [*([decisions] if decisions else []), *draw_curves(groups, out / "figures", metrics, x_axis)]
    md = [*md, *(f"![{p.stem}](figures/{p.name})" for p in figures)]
    (out / "results.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    aggregated = {
        "seeds": {v: [r.seed for r in runs] for v, runs in groups.items()},
        "per_step": aggregate(groups),
        "pass_at_k": {s: pass_at_k_curves(groups, s) for s in SPLITS},
    }
    (out / "aggregate.json").write_text(json.dumps(aggregated, indent=1))
    body = [f"<h1>{html.escape(title)}</h1>"]
    for heading, header, rows in sections:
        body += [f"<h3>{html.escape(heading)}</h3>", html_table(header, rows)]
    for p in figures:
        data = base64.b64encode(p.read_bytes()).decode()
        body.append(f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,{data}"></figure>')
    page = (
        '<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; img-src data:; style-src 'unsafe-inline'\">"
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
        "table{border-collapse:collapse;margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:2px 8px;"
        "text-align:right}img{max-width:48%}</style></head><body>" + "".join(body) + "</body></html>"
    )
    (out / "index.html").write_text(page, encoding="utf-8")
    return [*md, "", f"written: {out / 'results.md'}, {out / 'index.html'}, {out / 'aggregate.json'}"]


def compare_seeds(
    paths: Sequence[str | Path],
    output: str | Path | None = None,
    group_by: str | None = None,
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    x_axis: str = "step",
    window: int = 1,
    rules: Sequence[Hypothesis] | RulesFile = (),
    seeds: Sequence[int] | None = None,
    descriptive: bool = False,
) -> str:
    """Markdown comparison of variants across seeds; with ``output``, also ``results.md``,
    ``aggregate.json``, PNG figures and a self-contained ``index.html`` there. Paired comparisons
    (``comparison_rows``) are against ``baseline``, or between every pair without one; at equal
    steps and, when every run logged its sampled tokens, at equal tokens. ``x_axis``: ``step`` or
    ``tokens`` (cumulative sampled tokens) for the per-step figures. ``window``: training metrics
    are compared as their mean over each run's last ``window`` steps (1: the last step). ``rules``:
    pre-registered decision rules (``semrl.studies.decide``), or a rules file with a design
    (``semrl.studies.designs``: judged at its planned looks, each planned look appended to the
    sweep's ``looks.jsonl``), in the first section. ``seeds``: only these seeds (default: every
    seed found). ``descriptive``: report a seed count the design did not plan, with no outcome."""
    if x_axis not in ("step", "tokens"):
        raise ValueError(f"x_axis must be 'step' or 'tokens', got '{x_axis}'")
    groups = find_runs(paths, group_by, seeds)
    if baseline is not None and baseline not in groups:
        raise ValueError(f"--baseline '{baseline}' is not a variant; the variants are {', '.join(groups)}")
    metrics = list(metrics or CURVE_METRICS)
    seeds = sorted({r.seed for runs in groups.values() for r in runs})
    pairs = comparison_pairs(groups, baseline)
    budget = equal_token_budget(groups)
    sections = [s for split in SPLITS for s in _split_sections(groups, split, pairs, budget)]
    sections += _training_sections(groups, pairs, metrics, budget, window)
    forest: list[ForestRow] = []
    if isinstance(rules, RulesFile) and rules.design is not None:
        log = Path(paths[0]) / LOOKS_LOG if group_by is None else None
        section, forest = design_section(groups, rules, seeds is not None, descriptive, log)
        sections.insert(0, section)
    elif rules:
        listed = rules.rules if isinstance(rules, RulesFile) else rules
        decisions = decide_all(groups, listed)
        forest = decision_forest(groups, decisions)
        heading = (
            f"Decision rules, at equal steps ({decision_summary(decisions)}; no design declared: one look "
            "at 95% per rule assumed, docs/evaluation.md 'Designs')"
        )
        sections.insert(0, (heading, DECISION_HEADER, decision_rows(decisions)))
    counts = ", ".join(f"{v} ({len(r)})" for v, r in groups.items())
    title = f"{len(groups)} variants x seeds {seeds}: {counts}"
    md = [f"# {title}", ""]
    for heading, header, rows in sections:
        md += [f"**{heading}**", "", *markdown_lines(header, rows), ""]
    if output is not None:
        md = _write_outputs(Path(output), groups, title, sections, md, metrics, x_axis, forest)
    return "\n".join(md)
