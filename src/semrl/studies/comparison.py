"""Comparing variants across seeds, as numbers: per-step mean and standard error over seeds, paired
differences at the seed level (a 95% t-interval, how many seeds agree, the smallest detectable
difference and the seeds the observed one would need: ``semrl.studies.stats``), decision rules judged
at a design's planned looks (``semrl.studies.designs``), and the compute axis (cumulative sampled
tokens, values at equal tokens).

Standard error: the sample standard deviation over seeds (ddof = 1) over sqrt(n); 0 for one seed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from semrl.errors import ConfigError
from semrl.studies.decide import (
    COLLAPSED,
    Decision,
    Hypothesis,
    decide,
)
from semrl.studies.designs import (
    complete_seeds,
    judge_looks,
    judged_header,
    judged_rows,
    log_looks,
    primary_done,
)
from semrl.studies.designs import descriptive as descriptive_rules
from semrl.studies.discovery import TOKENS, Run
from semrl.studies.forest import ForestRow, forest_rows, rule_label
from semrl.studies.rules_file import RulesFile
from semrl.studies.sequential import CONTROLS
from semrl.studies.stats import compare_paired

logger = logging.getLogger(__name__)
Section = tuple[str, list[str], list[list[str]]]  # (heading, table header, rows)


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
        return (heading, judged_header(), judged_rows(judged)), forest_rows(judged, at_seeds)
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
    return (heading, judged_header(), judged_rows(looks[-1])), forest_rows(looks[-1], at_look)


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


def mean_tokens_at_steps(runs: Sequence[Run]) -> dict[int, float]:
    """step -> mean over seeds of the cumulative sampled tokens at that step."""
    by_run = [cumulative_tokens(r) for r in runs]
    steps = sorted({s for t in by_run for s in t})
    return {s: float(np.mean([t[s] for t in by_run if s in t])) for s in steps}
