"""Summarizing and judging an exploration (``semrl explore``'s records): per method and seed, its
difference from independent sampling at equal sampled tokens and, descriptively, at equal rollout
seconds; the summary table; and the decision rules judged with problems as the unit
(docs/evaluation.md, "Exploration at equal cost")."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from semrl.errors import ConfigError
from semrl.studies.designs import (
    LOOKS_LOG,
    Judged,
    complete_seeds,
    judge_looks,
    judged_header,
    judged_rows,
    log_looks,
)
from semrl.studies.explore import (
    EQUAL_COST_METRICS,
    IndependentSamples,
    Leaves,
    paired_differences,
    per_token,
)
from semrl.studies.explore_run import INDEPENDENT, Explored, read_calls
from semrl.studies.rules_file import RulesFile
from semrl.studies.stats import median_interval, paired_t, sign_p_value


def problem_seconds(
    records: Sequence[Explored], calls: Sequence[dict[str, Any]]
) -> dict[tuple[str, int, str], float]:
    """(method, seed, problem) -> the rollout seconds of its engine call, shared among the call's
    problems in proportion to the tokens each sampled (a call's problems run together, so their
    own times are not observed; this is the share they would take at one throughput)."""
    tokens = {(r.method, r.seed, r.problem): r.sampled_tokens for r in records}
    out: dict[tuple[str, int, str], float] = {}
    for call in calls:
        keys = [(call["method"], call["seed"], p) for p in call["problems"]]
        total = sum(tokens.get(k, 0) for k in keys)
        for key in keys:
            if key in tokens:
                out[key] = call["rollout_s"] * (tokens[key] / total if total else 1 / len(keys))
    return out


def equal_time_differences(
    records: Sequence[Explored], calls: Sequence[dict[str, Any]], method: str, metric: str
) -> tuple[dict[str, float], int]:
    """(problem -> the method's ``metric`` minus independent sampling's at the same rollout seconds,
    averaged over the method's seeds; rollouts left out because equal time needs more independent
    samples than were drawn). Independent sampling's seconds become tokens at its own throughput
    (its sampled tokens over its rollout seconds, pooled over its calls); descriptive, since the
    seconds depend on the machine and on what else ran on it."""
    reference = _reference(records)
    seconds = problem_seconds(records, calls)
    independent = [c for c in calls if c["method"] == INDEPENDENT]
    spent = sum(c["rollout_s"] for c in independent)
    if not spent:
        return {}, 0
    rate = sum(c["sampled_tokens"] for c in independent) / spent
    per_problem: dict[str, list[float]] = {}
    left_out = 0
    for r in records:
        key = (r.method, r.seed, r.problem)
        if r.method != method or key not in seconds or r.problem not in reference:
            continue
        samples = reference[r.problem]
        tokens = seconds[key] * rate
        if tokens / samples.mean_length > samples.n:
            left_out += 1
            continue
        difference = r.leaves().value(metric) - samples.at_cost(metric, tokens)
        per_problem.setdefault(r.problem, []).append(difference)
    return {p: sum(d) / len(d) for p, d in per_problem.items()}, left_out


def summarize(records: Sequence[Explored], calls: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Per method and metric at equal cost: the mean over problems of method - independent, its
    95% t-interval, the median's sign-test interval and p-value, how many problems are above, at and
    below 0, and the method's metric per 1,000 sampled tokens beside independent sampling's. With
    the engine calls' log: each method's rollout seconds, and the mean difference at equal seconds
    (``equal_time_differences``)."""
    reference = _reference(records)
    by_method: dict[str, list[Leaves]] = {}
    for r in records:
        by_method.setdefault(r.method, []).append(r.leaves())
    out: dict[str, Any] = {"problems": len(reference), "methods": {}}
    for method, rollouts in by_method.items():
        row: dict[str, Any] = {
            "rollouts": len(rollouts),
            "sampled_tokens": sum(x.sampled_tokens for x in rollouts),
            "per_1k_tokens": {m: per_token(rollouts, m) for m in EQUAL_COST_METRICS},
        }
        if method != INDEPENDENT:
            for metric in EQUAL_COST_METRICS:
                d = list(paired_differences(rollouts, reference, metric).values())
                mean, low, high = paired_t(d)
                median, median_low, median_high = median_interval(d, 0.05)
                x = np.asarray(d)
                row[metric] = {
                    "mean": mean,
                    "t_interval": [low, high],
                    "median": median,
                    "sign_interval": [median_low, median_high],
                    "p_sign": sign_p_value(d),
                    "above_at_below": [int((x > 0).sum()), int((x == 0).sum()), int((x < 0).sum())],
                }
                if calls:
                    timed, left_out = equal_time_differences(records, calls, method, metric)
                    t_mean, t_low, t_high = paired_t(list(timed.values()))
                    row[metric]["equal_time"] = {
                        "mean": t_mean,
                        "t_interval": [t_low, t_high],
                        "problems": len(timed),
                        "rollouts_left_out": left_out,
                    }
        mine = [c for c in calls if c["method"] == method]
        if mine:
            seconds = sum(c["rollout_s"] for c in mine)
            row["rollout_s"] = seconds
            row["tokens_per_s"] = sum(c["sampled_tokens"] for c in mine) / seconds if seconds else math.nan
        out["methods"][method] = row
    return out


def summary_table(summary: dict[str, Any]) -> str:
    """The summary as Markdown: one row per method and metric."""
    lines = [
        f"{summary['problems']} problems; each method - independent sampling at equal sampled tokens, "
        "per problem (the unit), then over problems.\n",
        "| method | metric | mean difference | 95% t-interval | median | 95% sign-test interval | p (sign) "
        "| problems above / at / below 0 | per 1k tokens (method / independent) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    reference = summary["methods"].get(INDEPENDENT, {}).get("per_1k_tokens", {})

    def num(x: float) -> str:
        return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.3f}"

    for method, row in summary["methods"].items():
        if method == INDEPENDENT:
            continue
        for metric in EQUAL_COST_METRICS:
            c = row[metric]
            lines.append(
                f"| {method} | {metric} | {num(c['mean'])} "
                f"| [{num(c['t_interval'][0])}, {num(c['t_interval'][1])}] "
                f"| {num(c['median'])} | [{num(c['sign_interval'][0])}, {num(c['sign_interval'][1])}] "
                f"| {c['p_sign']:.3g} | {' / '.join(map(str, c['above_at_below']))} "
                f"| {row['per_1k_tokens'][metric]:.3f} / {reference.get(metric, math.nan):.3f} |"
            )
    timed = [(m, row) for m, row in summary["methods"].items() if "rollout_s" in row]
    if timed:
        lines += [
            "\nAt equal rollout seconds (descriptive: seconds depend on the machine and what shared it; a "
            "call's seconds are shared among its problems by their sampled tokens).\n",
            "| method | rollout s | sampled tokens / s | metric | mean difference at equal seconds "
            "| 95% t-interval | problems | rollouts left out |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for method, row in timed:
            for metric in EQUAL_COST_METRICS if method != INDEPENDENT else ():
                t = row[metric]["equal_time"]
                lines.append(
                    f"| {method} | {row['rollout_s']:.1f} | {row['tokens_per_s']:.1f} | {metric} "
                    f"| {num(t['mean'])} | [{num(t['t_interval'][0])}, {num(t['t_interval'][1])}] "
                    f"| {t['problems']} | {t['rollouts_left_out']} |"
                )
            if method == INDEPENDENT:
                lines.append(f"| {method} | {row['rollout_s']:.1f} | {row['tokens_per_s']:.1f} | | | | | |")
    return "\n".join(lines) + "\n"


def write_summary(out_dir: Path, records: Sequence[Explored]) -> dict[str, Any]:
    summary = summarize(records, read_calls(out_dir))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out_dir / "results.md").write_text(summary_table(summary), encoding="utf-8")
    return summary


def _reference(records: Sequence[Explored]) -> dict[str, IndependentSamples]:
    return {
        r.problem: IndependentSamples(r.problem, tuple(r.lengths), tuple(r.correct), tuple(r.clusters))
        for r in records
        if r.method == INDEPENDENT
    }


def rule_differences_by_problem(
    records: Sequence[Explored], rules_file: RulesFile
) -> tuple[dict[str, dict[int, float]], list[str]]:
    """(rule id -> problem index -> difference, the problems in data order): a rule's pair
    ``[variant, baseline]`` compares their equal-cost differences from independent sampling
    (``independent`` itself: 0), so that problems stand where seeds stand in a study's design."""
    reference = _reference(records)
    order = list(dict.fromkeys(r.problem for r in records if r.method == INDEPENDENT))
    methods = {r.method for r in records}
    out: dict[str, dict[int, float]] = {}
    for rule in rules_file.rules:
        if rule.metric not in EQUAL_COST_METRICS:
            raise ConfigError(
                f"rule {rule.id}: an exploration rule compares one of {', '.join(EQUAL_COST_METRICS)} "
                f"at equal cost, got {rule.metric!r}"
            )
        if rule.over != "last" or rule.window != 1:
            raise ConfigError(
                f"rule {rule.id}: an exploration rule has one value per problem; leave out over and window"
            )
        missing = [m for m in (rule.variant, rule.baseline) if m not in methods]
        if missing:
            raise ConfigError(
                f"rule {rule.id}: no records of {', '.join(missing)}; the records hold "
                f"{', '.join(sorted(methods))}"
            )
        differences = []
        for method in (rule.variant, rule.baseline):
            if method == INDEPENDENT:
                differences.append(dict.fromkeys(order, 0.0))
                continue
            rollouts = [r.leaves() for r in records if r.method == method]
            differences.append(paired_differences(rollouts, reference, rule.metric))
        variant, baseline = differences
        out[rule.id] = {
            i: variant[p] - baseline[p] for i, p in enumerate(order) if p in variant and p in baseline
        }
    return out, order


def judge_exploration(
    records: Sequence[Explored], rules_file: RulesFile, out_dir: Path
) -> tuple[str, list[list[str]], list[Judged]]:
    """The rules judged at the latest planned look the problems reach (a look at n problems reads
    the first n in data order), every look appended once to ``out_dir/looks.jsonl``; (heading,
    table rows, judged rules)."""
    design = rules_file.design
    if design is None:
        raise ConfigError(
            "an exploration rules file needs a design (fixed or group_sequential, looks in problems)"
        )
    if design.type == "anytime":
        raise ConfigError("an exploration rules file takes a fixed or group_sequential design, not anytime")
    diffs, _ = rule_differences_by_problem(records, rules_file)
    units = complete_seeds(diffs)
    looks = judge_looks(diffs, rules_file, units)
    if not looks:
        raise ConfigError(
            f"{len(units)} problems have records of every method the rules name; the design's first look "
            f"is at {design.looks[0]} problems"
        )
    log_looks(out_dir / LOOKS_LOG, looks, design, units)
    k = len(looks)
    families = ", ".join(f"{f}: {c}" for f, c in design.families.items())
    heading = (
        f"Exploration rules, look {k} of {len(design.looks)} at {design.looks[k - 1]} problems "
        f"(problems as the unit; {design.type} design, alpha {design.alpha:g} two-sided per family, "
        f"{families})"
    )
    return heading, [judged_header("problems"), *judged_rows(looks[-1])], looks[-1]
