"""Comparing variants across seeds: a sweep directory (``OUT/VARIANT/seed-S``) or run directories
grouped by a config key.

- per-step mean and standard error over seeds of every logged metric (``aggregate.json``);
- final held-out (and transfer) metrics as mean +- s.e. (n seeds), with the base model's row;
- paired differences between variants at the seed level: a 95% t-interval over the per-seed
  differences, how many seeds agree, the smallest detectable difference and the seeds the observed
  one would need (``semrl.studies.stats``), at equal steps and at equal sampled tokens (held-out
  metrics at equal tokens only where the runs evaluated during training);
- decision rules judged at a study design's planned looks (``semrl.studies.designs``);
- the pass@k-vs-k curve of the base model and every variant, and per-step curves with s.e. bands.

Standard error: the sample standard deviation over seeds (ddof = 1) over sqrt(n); 0 for one seed.
docs/sweeps.md describes the output.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import yaml

from semrl.core.jsonl import log_exists, read_jsonl
from semrl.errors import ConfigError
from semrl.studies.decide import (
    COLLAPSED,
    DECISION_HEADER,
    NO_SIGNAL,
    Decision,
    Hypothesis,
    decide,
    decision_rows,
    decision_summary,
)
from semrl.studies.designs import (
    JUDGED_HEADER,
    LOOKS_LOG,
    RulesFile,
    complete_seeds,
    judge_looks,
    judged_rows,
    log_looks,
    primary_done,
)
from semrl.studies.designs import descriptive as descriptive_rules
from semrl.studies.forest import ForestRow, draw_forest, forest_rows, rule_label
from semrl.studies.sequential import CONTROLS
from semrl.studies.stats import compare_paired
from semrl.tracking import metric_names as names

# semrl.studies.sweep.DONE_FILE (not imported: the sweep module loads the config system)
DONE_FILE = "sweep_done.json"

logger = logging.getLogger(__name__)

TOKENS = names.SAMPLED_TOKENS  # logged every step: the compute axis
SEED_DIR = re.compile(r"^seed-(\d+)$")
SPLITS = ("eval", "transfer")
CURVE_METRICS = [
    names.REWARD,
    names.ACCURACY,
    names.ENTROPY,
    names.LOW_ENTROPY_FRAC,
    names.KL,
    names.RESPONSE_LENGTH,
    names.CORRECT_LENGTH,
    names.DISTINCT_ANSWERS,
    names.STEP_S,
]


@dataclass(frozen=True)
class Run:
    """One finished run of a study: its variant, seed, directory and logged metric rows."""

    variant: str
    seed: int
    run_dir: Path
    rows: list[dict[str, Any]]

    def series(self, metric: str) -> dict[int, float]:
        """step -> the last value logged for that step."""
        out: dict[int, float] = {}
        for row in self.rows:
            value = row.get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                out[int(row["step"])] = float(value)
        return out

    def final(self, metric: str, window: int = 1) -> float | None:
        """The last value logged, or with ``window`` the mean over the last that many logged steps."""
        points = self.series(metric)
        if not points:
            return None
        last = sorted(points)[-window:]
        return float(np.mean([points[s] for s in last]))

    def curve(self, metric: str) -> float | None:
        """The mean over every value logged after step 0: a learning curve's area per evaluation."""
        points = [value for step, value in self.series(metric).items() if step > 0]
        return float(np.mean(points)) if points else None

    def collapsed(self) -> float | None:
        """1.0 when the run had no reward signal (every group's rewards equal) in more than half of
        its steps, else 0.0; None when it logged no ``reward/frac_groups_all_equal``
        (``semrl.studies.decide``, the ``collapsed`` metric)."""
        shares = self.series(NO_SIGNAL)
        if not shares:
            return None
        silent = sum(1 for step, share in shares.items() if step > 0 and share >= 1.0)
        steps = sum(1 for step in shares if step > 0)
        return float(silent > steps / 2)

    def eval_steps(self, split: str) -> list[int]:
        return sorted(self.series(f"{split}/problems"))


def _config_value(run_dir: Path, dotted: str) -> Any:
    config = (
        yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").exists() else {}
    )
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"{run_dir / 'config.yaml'} has no key '{dotted}' to group by")
        node = node[part]
    return node


def _sweep_runs(root: Path) -> list[tuple[str, int, Path]]:
    """(variant, seed, run directory) of a sweep directory's ``VARIANT/seed-S`` runs; while the
    sweep still runs, only the finished ones (a half-run would bias the means)."""
    if not root.exists():
        raise FileNotFoundError(
            f"'{root}' does not exist: give a sweep directory (the output_dir of a sweep file)"
        )
    children = sorted(root.iterdir()) if root.is_dir() else []
    variant_dirs = [p for p in children if p.is_dir() and not p.name.startswith(".")]
    found = [
        (variant_dir.name, int(match.group(1)), run_dir)
        for variant_dir in variant_dirs
        for run_dir in sorted(variant_dir.iterdir())
        if (match := SEED_DIR.match(run_dir.name)) and log_exists(run_dir / "metrics.jsonl")
    ]
    if any((run_dir / DONE_FILE).exists() for _, _, run_dir in found):
        unfinished = [r for r in found if not (r[2] / DONE_FILE).exists()]
        if unfinished:
            logger.warning(
                "%d unfinished run(s) left out: %s",
                len(unfinished),
                ", ".join(f"{v}/seed-{s}" for v, s, _ in unfinished),
            )
        found = [r for r in found if (r[2] / DONE_FILE).exists()]
    if not found:
        raise FileNotFoundError(
            f"{root} holds no VARIANT/seed-S run with a metrics.jsonl: is it a sweep directory?"
        )
    return found


def _grouped_runs(paths: Sequence[str | Path], group_by: str) -> list[tuple[str, int, Path]]:
    """(variant, seed, run directory) of run directories, the variant read from the config key
    ``group_by`` and the seed from ``trainer.seed``."""
    found = []
    for path in map(Path, paths):
        if not log_exists(path / "metrics.jsonl"):
            raise FileNotFoundError(
                f"{path / 'metrics.jsonl'} does not exist: is '{path}' a semrl run directory?"
            )
        found.append((str(_config_value(path, group_by)), int(_config_value(path, "trainer.seed")), path))
    return found


def find_runs(
    paths: Sequence[str | Path], group_by: str | None = None, seeds: Sequence[int] | None = None
) -> dict[str, list[Run]]:
    """Runs grouped into variants: one sweep directory (its ``VARIANT/seed-S`` runs), or run
    directories grouped by the config key ``group_by`` (seed: ``trainer.seed``). ``seeds``: keep
    only these seeds, e.g. those whose runs have all finished while a sweep goes on."""
    if group_by is None and len(paths) != 1:
        raise ValueError(
            "give one sweep directory, or run directories with --group-by KEY (e.g. algorithm.method)"
        )
    found = _sweep_runs(Path(paths[0])) if group_by is None else _grouped_runs(paths, group_by)
    if seeds is not None:
        wanted, have = set(seeds), {seed for _, seed, _ in found}
        if missing := sorted(wanted - have):
            raise ValueError(
                f"--seeds: no finished run has seed {', '.join(map(str, missing))}; the runs' seeds "
                f"are {sorted(have)}"
            )
        found = [r for r in found if r[1] in wanted]
    groups: dict[str, list[Run]] = {}
    for variant, seed, run_dir in found:
        if any(r.seed == seed for r in groups.get(variant, [])):
            raise ValueError(
                f"variant '{variant}' has two runs with seed {seed} ({run_dir}); group by another key"
            )
        groups.setdefault(variant, []).append(
            Run(variant, seed, run_dir, read_jsonl(run_dir / "metrics.jsonl"))
        )
    return {v: sorted(runs, key=lambda r: r.seed) for v, runs in groups.items()}


def mean_se(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, standard error, n): s.e. = sample std (ddof 1) / sqrt(n), 0 for a single value."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan, math.nan, 0
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
    return float(x.mean()), se, int(x.size)


def per_step(runs: Sequence[Run], metric: str) -> list[tuple[int, float, float, int]]:
    """(step, mean, s.e., n seeds) at every step some seed logged ``metric``."""
    by_run = [r.series(metric) for r in runs]
    steps = sorted({s for points in by_run for s in points})
    return [(s, *mean_se([p[s] for p in by_run if s in p])) for s in steps]


def aggregate(groups: dict[str, list[Run]]) -> dict[str, dict[str, list[tuple[int, float, float, int]]]]:
    """variant -> metric -> per-step (step, mean, s.e., n) for every metric any run logged."""
    out = {}
    for variant, runs in groups.items():
        metrics = sorted({k for r in runs for row in r.rows for k in row if k != "step"})
        out[variant] = {m: per_step(runs, m) for m in metrics}
    return out


# ----------------------------------------------------------------------------------------------
# Paired comparisons at the seed level, and the compute axis


def seed_differences(
    variant: Sequence[Run],
    baseline: Sequence[Run],
    metric: str,
    budget: float | None = None,
    window: int = 1,
) -> list[float]:
    """Per-seed differences variant - baseline of ``metric`` over the seeds both ran: at each run's
    last value (its final evaluation for ``eval/`` and ``transfer/`` metrics), or with ``budget``
    at that many cumulative sampled tokens (``value_at_tokens``); with ``window``, the mean over each
    run's last ``window`` logged steps. A seed is the paired unit: the
    runs of one seed share their data order and held-out problems."""
    theirs = {r.seed: r for r in baseline}
    out = []
    for run in variant:
        other = theirs.get(run.seed)
        if other is None:
            continue
        if budget is None:
            a, b = run.final(metric, window), other.final(metric, window)
        else:
            a, b = value_at_tokens(run, metric, budget), value_at_tokens(other, metric, budget)
        if a is not None and b is not None:
            out.append(a - b)
    return out


def comparison_pairs(groups: dict[str, list[Run]], baseline: str | None) -> list[tuple[str, str]]:
    """(variant, baseline) pairs: every variant against ``baseline``, or with none every pair."""
    names = list(groups)
    if baseline is not None:
        return [(v, baseline) for v in names if v != baseline]
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]


def comparison_rows(
    groups: dict[str, list[Run]],
    pairs: Sequence[tuple[str, str]],
    metrics: Sequence[str],
    budget: float | None = None,
    prefix: str = "",
    window: int = 1,
) -> list[list[str]]:
    """One row per pair and metric with paired seeds (named without ``prefix``): the difference, its
    t-interval, the seeds that agree, whether the interval excludes 0, the minimal detectable effect
    at 80% power and the seeds the observed difference would need (``semrl.studies.stats``)."""
    rows = []
    for variant, base in pairs:
        for metric in metrics:
            d = seed_differences(groups[variant], groups[base], metric, budget, window)
            if not d:
                continue
            c = compare_paired(d, tie=1e-9)
            rows.append(
                [
                    f"{variant} - {base}",
                    metric.removeprefix(prefix),
                    f"{c.estimate:+.3f}",
                    c.interval_text,
                    str(c.seeds),
                    c.agreement_text,
                    "yes" if c.excludes_zero else "no",
                    "" if math.isnan(c.mde) else f"{c.mde:.3f}",
                    "" if c.seeds_needed is None else str(c.seeds_needed),
                ]
            )
    return rows


def rule_differences(
    groups: dict[str, list[Run]], rules: Sequence[Hypothesis]
) -> dict[str, dict[int, float]]:
    """rule id -> seed -> the rule's per-seed difference (``rule_value``), for the seeds where both
    of its variants have one."""
    out: dict[str, dict[int, float]] = {}
    for rule in rules:
        theirs = {r.seed: r for r in groups.get(rule.baseline, [])}
        values = {}
        for run in groups.get(rule.variant, []):
            other = theirs.get(run.seed)
            if other is not None:
                a, b = rule_value(run, rule, other), rule_value(other, rule, run)
                if a is not None and b is not None:
                    values[run.seed] = a - b
        out[rule.id] = values
    return out


def rule_value(run: Run, rule: Hypothesis, paired: Run) -> float | None:
    """What ``rule`` reads of ``run`` (whose pair of the same seed is ``paired``): its last value or
    the mean of its last ``window`` steps, or with ``over: curve`` the mean over its evaluations
    after step 0, which the pair must have taken at the same steps (``semrl.studies.decide``)."""
    if rule.metric == COLLAPSED:
        return run.collapsed()
    if rule.over != "curve":
        return run.final(rule.metric, rule.window)
    split, _, name = rule.metric.partition("/")
    steps, theirs = (sorted(s for s in r.series(rule.metric) if s > 0) for r in (run, paired))
    if steps != theirs:
        raise ConfigError(
            f"rule {rule.id} (over: curve): {run.run_dir} evaluated {rule.metric} at steps {steps}, "
            f"{paired.run_dir} at {theirs}; a curve compares the same checkpoints, so give both "
            "runs the same logging.eval_every and trainer.steps"
        )
    if name.startswith("pass@") and name[5:].isdigit():
        k = int(name[5:])
        n = max(
            (int(key.split("@")[1]) for row in run.rows for key in row if key.startswith(f"{split}/mean@")),
            default=0,
        )
        if n < 2 * k:
            raise ConfigError(
                f"rule {rule.id} (over: curve): {rule.metric} from {n} samples per problem; a pass@{k} curve "
                f"needs at least {2 * k} (logging.eval_samples={2 * k}), or compare pass@{max(n // 2, 1)}"
            )
    return run.curve(rule.metric)


def design_section(
    groups: dict[str, list[Run]],
    rules: RulesFile,
    chosen: bool,
    descriptive: bool,
    log: Path | None,
) -> tuple[Section, list[ForestRow]]:
    """The decision section of a rules file with a design: its latest planned look on the first
    seeds that finished every variant the rules name (``semrl.studies.designs``), and that look's
    rows of the forest plot. ``chosen``: the seeds were picked (``--seeds``), so they must form a
    planned look or be ``descriptive``."""
    design = rules.design
    assert design is not None
    diffs = rule_differences(groups, rules.rules)
    complete = complete_seeds(diffs)
    planned = ", ".join(map(str, design.looks))
    if chosen and len(complete) not in design.looks and not descriptive:
        raise ConfigError(
            f"--seeds gives {len(complete)} seeds with every variant finished; the design looks at {planned} "
            "seeds only. A look it did not plan would spend error rate it does not have: pick a planned "
            "look, or pass --descriptive for intervals without outcomes"
        )
    looks = judge_looks(diffs, rules, complete)
    if not looks or (chosen and descriptive and len(complete) not in design.looks):
        at_seeds = {k: [v[s] for s in complete] for k, v in diffs.items()}
        judged = descriptive_rules(at_seeds, rules)
        heading = (
            f"Decision rules: descriptive only, {len(complete)} seeds ({design.type} design, looks at "
            f"{planned} seeds)"
        )
        return (heading, JUDGED_HEADER, judged_rows(judged)), forest_rows(judged, at_seeds)
    k, n = len(looks), design.looks[len(looks) - 1]
    at_look = {rule_id: [by_seed[s] for s in sorted(complete)[:n]] for rule_id, by_seed in diffs.items()}
    if log is not None:
        log_looks(log, looks, design, complete)
    nxt = f"; next look at {design.looks[k]} seeds" if k < len(design.looks) else "; the last look"
    stop = "every primary rule settled: the study stops" if primary_done(looks[-1]) else "primary rules open"
    heading = (
        f"Decision rules, look {k} of {len(design.looks)} at {n} seeds ({design.type} design, "
        f"{ {'fixed': 'one look', 'anytime': 't-test e-value'}.get(design.type, design.boundary) }, "
        f"alpha {design.alpha:g} two-sided per "
        f"family, {', '.join(f'{f}: {c} ({CONTROLS[c]})' for f, c in design.families.items())}; {stop}{nxt})"
    )
    return (heading, JUDGED_HEADER, judged_rows(looks[-1])), forest_rows(looks[-1], at_look)


def decide_all(groups: dict[str, list[Run]], rules: Sequence[Hypothesis]) -> list[Decision]:
    """Every pre-registered rule judged at equal steps, on the seeds both of its variants ran
    (``semrl.studies.decide``)."""
    decisions = []
    for rule in rules:
        missing = [name for name in (rule.variant, rule.baseline) if name not in groups]
        if missing:  # a study still running, or a misspelt name: the row says so, the others go on
            variants = ", ".join(groups)
            logger.warning("rule %s: no finished run of %s; the variants are %s", rule.id, missing, variants)
        d = [] if missing else list(rule_differences(groups, [rule])[rule.id].values())
        comparison = compare_paired(d, tie=1e-9, test=rule.test) if d else None
        outcome = decide(comparison, rule.expect, rule.margin) if comparison else "undecided"
        decisions.append(Decision(rule, comparison, outcome))
    return decisions


def decision_forest(groups: dict[str, list[Run]], decisions: Sequence[Decision]) -> list[ForestRow]:
    """The forest plot's rows of rules judged without a design (one look, each at 95%): the
    descriptive interval is the one they were judged by; rules with no seed are left out."""
    rows = []
    for decision in decisions:
        rule = decision.hypothesis
        if decision.comparison is None:
            continue
        d = list(rule_differences(groups, [rule])[rule.id].values())
        rows.append(
            ForestRow(
                label=rule_label(rule),
                variant=rule.variant,
                estimate=decision.comparison.estimate,
                design=None,
                level=None,
                descriptive=(decision.comparison.low, decision.comparison.high),
                margin=rule.margin,
                outcome=decision.outcome,
                differences=d,
            )
        )
    return rows


COMPARISON_HEADER = [
    "pair",
    "metric",
    "difference",
    "95% t-interval",
    "seeds",
    "wins / ties / losses",
    "excludes 0",
    "detectable at 80%",
    "seeds needed",
]


def cumulative_tokens(run: Run) -> dict[int, float]:
    """step -> tokens sampled in steps 1..step (``rollout/sampled_tokens``; step 0 -> 0); {} for a
    run that did not log them."""
    per_step_tokens = run.series(TOKENS)
    if not per_step_tokens:
        return {}
    out, total = {0: 0.0}, 0.0
    for step in sorted(per_step_tokens):
        total += per_step_tokens[step]
        out[step] = total
    return out


def value_at_tokens(run: Run, metric: str, budget: float) -> float | None:
    """``metric`` at ``budget`` cumulative sampled tokens: linear between the two logged points
    (steps, or evaluations) around it; None when the run sampled fewer tokens or has no point at or
    before it."""
    tokens = cumulative_tokens(run)
    points = sorted((tokens[s], v) for s, v in run.series(metric).items() if s in tokens)
    if not points or points[-1][0] < budget or points[0][0] > budget:
        return None
    xs, ys = zip(*points, strict=True)
    return float(np.interp(budget, xs, ys))


def equal_token_budget(groups: dict[str, list[Run]]) -> float | None:
    """The largest token count every run reached: the fewest tokens any run sampled in all."""
    totals = [max(t.values()) for runs in groups.values() for r in runs if (t := cumulative_tokens(r))]
    if not totals or len(totals) < sum(len(runs) for runs in groups.values()):
        return None
    return min(totals)


# ----------------------------------------------------------------------------------------------
# Tables and figures


def _num_samples(groups: dict[str, list[Run]], split: str) -> int:
    ks = [
        int(m.split("@")[1])
        for runs in groups.values()
        for r in runs
        for m in (r.rows[-1] if r.rows else {})
        if m.startswith(f"{split}/mean@")
    ]
    return max(ks, default=0)


def _fmt(mean: float, se: float, n: int, digits: int = 3) -> str:
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
    n = _num_samples(groups, split)
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
                *(_fmt(*mean_se([b[m] for b in base.values() if m in b])) for m in metrics),
            ]
        )
    for variant, runs in groups.items():
        finals = _finished(runs, split)
        cells = [
            _fmt(
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
    n = _num_samples(groups, split)
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


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def mean_tokens_at_steps(runs: Sequence[Run]) -> dict[int, float]:
    """step -> mean over seeds of the cumulative sampled tokens at that step."""
    by_run = [cumulative_tokens(r) for r in runs]
    steps = sorted({s for t in by_run for s in t})
    return {s: float(np.mean([t[s] for t in by_run if s in t])) for s in steps}


def _band(ax: Any, points: list[tuple[float, float, float, int]], label: str) -> None:
    """One variant's mean line with a +- s.e. band, in the variant's colour."""
    from semrl.studies.runs import method_color

    x = np.array([p[0] for p in points], dtype=float)
    m = np.array([p[1] for p in points])
    se = np.array([p[2] for p in points])
    color = method_color(label)
    ax.plot(x, m, marker="o", markersize=2.5, label=label, color=color)
    ax.fill_between(x, m - se, m + se, color=color, alpha=0.2, linewidth=0)


def _figure(
    plt: Any,
    path: Path,
    lines: dict[str, list[Any]],
    xlabel: str,
    ylabel: str,
    size: tuple[float, float],
    log_x: bool = False,
) -> Path:
    """A figure of every variant's band, saved as ``path``."""
    fig, ax = plt.subplots(figsize=size)
    for variant, points in lines.items():
        if points:
            _band(ax, points, variant)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plots(
    groups: dict[str, list[Run]], out: Path, metrics: Sequence[str], x_axis: str = "step"
) -> list[Path]:
    from semrl.studies.runs import pyplot

    plt = pyplot()
    if plt is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for split in SPLITS:
        curves = pass_at_k_curves(groups, split)
        if curves:
            ylabel = f"{'held-out' if split == 'eval' else 'transfer'} pass@k"
            written.append(
                _figure(
                    plt,
                    out / f"pass_at_k_{split}.png",
                    curves,
                    "k (samples per problem)",
                    ylabel,
                    (5.5, 3.6),
                    log_x=True,
                )
            )
    tokens = {v: mean_tokens_at_steps(runs) for v, runs in groups.items()}
    xlabel = "step" if x_axis == "step" else "sampled tokens (cumulative, mean over seeds)"
    for metric in metrics:
        by_step = {v: [p for p in per_step(runs, metric) if p[0] > 0] for v, runs in groups.items()}
        lines: dict[str, list[Any]] = dict(by_step)  # (x, mean, s.e., n), x a step or tokens
        if x_axis == "tokens":  # x: the mean cumulative sampled tokens over seeds at that step
            lines = {
                v: [(tokens[v][p[0]], *p[1:]) for p in pts if p[0] in tokens[v]] for v, pts in by_step.items()
            }
        if any(lines.values()):
            path = out / (metric.replace("/", "_").replace("@", "_at_") + ".png")
            ylabel = f"{metric} (mean ± s.e. over seeds)"
            written.append(_figure(plt, path, lines, xlabel, ylabel, (5.5, 3.4)))
    return written


Section = tuple[str, list[str], list[list[str]]]  # (heading, table header, rows)


def _split_sections(
    groups: dict[str, list[Run]], split: str, pairs: list[tuple[str, str]], budget: float | None
) -> list[Section]:
    """The final tables of one evaluation split: the final metrics, pass@k for every k and the paired
    differences, at equal steps and, with ``budget``, at equal sampled tokens."""
    header, rows = final_table(groups, split)
    if not rows:
        return []
    title = "Held-out problems" if split == "eval" else "Transfer split"
    n = _num_samples(groups, split)
    curve = pass_at_k_curves(groups, split)
    sections: list[Section] = [
        (f"{title}: final evaluation, mean ± s.e. (n seeds)", header, rows),
        (
            f"{title}: pass@k for k = 1..{n}, mean ± s.e.",
            ["k", *curve],
            [[str(k), *(_fmt(*pts[k - 1][1:]) for pts in curve.values())] for k in range(1, n + 1)],
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
                    _fmt(*mean_se([x for r in runs if (x := value_at_tokens(r, m, budget)) is not None]))
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
            [v, _fmt(*mean_se([max(cumulative_tokens(r).values()) for r in runs]), digits=0)]
            for v, runs in groups.items()
        ]
        sections.append(("Sampled tokens in all, mean ± s.e. (n seeds)", ["variant", "tokens"], tokens_row))
    for metric in metrics:
        lines = {v: {p[0]: p for p in per_step(runs, metric) if p[0] > 0} for v, runs in groups.items()}
        if steps := sorted({s for pts in lines.values() for s in pts}):
            rows = [
                [str(s), *(_fmt(*pts[s][1:]) if s in pts else "" for pts in lines.values())] for s in steps
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
    figures = [*([decisions] if decisions else []), *_plots(groups, out / "figures", metrics, x_axis)]
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
        body += [f"<h3>{html.escape(heading)}</h3>", _html_table(header, rows)]
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
