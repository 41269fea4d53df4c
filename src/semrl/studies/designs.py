"""Study designs: decision rules judged at planned looks, with multiplicity, and the looks log
(docs/evaluation.md, "Designs"). The rules file is read by ``semrl.studies.rules_file``."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from semrl.errors import ConfigError
from semrl.studies.decide import Hypothesis, metric_label
from semrl.studies.distributions import chi2_ppf
from semrl.studies.rules_file import Design, RulesFile
from semrl.studies.sequential import (
    MAX_SIGN_FLIP_SEEDS,
    benjamini_hochberg,
    confidence_sequence,
    repeated_interval,
    sign_flip_p_value,
    t_p_value,
)
from semrl.studies.stats import median_interval, seeds_needed, sign_p_value, sign_seeds_to_settle

SETTLED = ("decided", "decided against")
STOPPING = (*SETTLED, "ruled out")
LOOKS_LOG = "looks.jsonl"


@dataclass(frozen=True)
class Judged:
    """One rule at one look."""

    rule: Hypothesis
    family: str
    seeds: int
    estimate: float
    low: float
    high: float
    level: float  # the nominal two-sided level its interval is at (nan: descriptive)
    p_t: float
    p_sign_flip: float | None  # exact, for <= 12 seeds
    outcome: str
    look: int | None  # 1-based look at which the outcome was reached; None: descriptive
    sd: float = math.nan
    p_sign: float = math.nan  # the exact sign test's p-value (test: sign)
    sign_seeds: int | None = None  # a new study's seeds for the sign test (stats.sign_seeds_to_settle)

    def record(self) -> dict[str, Any]:
        out = {
            "id": self.rule.id,
            "family": self.family,
            "seeds": self.seeds,
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "level": self.level,
            "p_t": self.p_t,
            "p_sign_flip": self.p_sign_flip,
            "outcome": self.outcome,
            "settled_at_look": self.look,
        }
        if self.rule.test != "t":  # the looks logs of t rules keep the keys they always had
            out |= {"test": self.rule.test, "p_sign": self.p_sign}
        return out


def outcome_of(low: float, high: float, rule: Hypothesis, decide_at_margin: bool = False) -> str:
    """The exclusive outcome of an interval (module docstring, precedence 1-4)."""
    if math.isnan(low) or math.isnan(high):
        return "undecided"
    toward = (-high, -low) if rule.expect == "less" else (low, high)
    against = -rule.margin if rule.expect == "not_below" else 0.0
    decide = rule.margin if decide_at_margin and rule.expect != "not_below" else against
    if toward[0] > decide:
        return "decided"
    if toward[1] < against:
        return "decided against"
    if rule.expect != "not_below" and -rule.margin < low and high < rule.margin:
        return "ruled out"
    return "undecided"


def _judge_rule(
    rule: Hypothesis, d: list[float], level: float, design: Design, family: str, look: int, at_margin: bool
) -> Judged:
    """One rule's interval at ``level`` (a repeated t-interval, the sign test's median interval, or
    an anytime design's confidence sequence), p-values and outcome at look ``look`` (0-based)."""
    if design.type == "anytime":
        mean, low, high = confidence_sequence(d, level, design.prior_scale)
    else:
        mean, low, high = _interval(rule, d, level)
    outcome = outcome_of(low, high, rule, at_margin)
    settled_at = look + 1 if outcome in STOPPING else None
    return _judged(rule, family, d, mean, low, high, level, outcome, settled_at)


def _interval(rule: Hypothesis, d: list[float], level: float) -> tuple[float, float, float]:
    """(estimate, low, high) of the rule's test at two-sided ``level``: the mean's t-interval, or the
    median's sign-test interval."""
    return median_interval(d, level) if rule.test == "sign" else repeated_interval(d, level)


def _judged(
    rule: Hypothesis,
    family: str,
    d: list[float],
    estimate: float,
    low: float,
    high: float,
    level: float,
    outcome: str,
    look: int | None,
) -> Judged:
    """A rule's ``Judged`` with every p-value and spread computed from its per-seed differences."""
    flip = sign_flip_p_value(d) if 1 <= len(d) <= MAX_SIGN_FLIP_SEEDS else None
    sd = float(np.std(d, ddof=1)) if len(d) > 1 else math.nan
    needed = sign_seeds_to_settle(d, tie=0.0) if rule.test == "sign" else None
    return Judged(
        rule,
        family,
        len(d),
        estimate,
        low,
        high,
        level,
        t_p_value(d),
        flip,
        outcome,
        look,
        sd,
        sign_p_value(d),
        needed,
    )


def _judge_family(
    rules: Sequence[Hypothesis],
    diffs: dict[str, list[float]],
    design: Design,
    look: int,
    correction: str,
    settled: dict[str, Judged],
    family: str,
    at_margin: frozenset[str],
) -> list[Judged]:
    """The rules of one family at look ``look`` (0-based), the ones settled earlier carried over."""
    open_rules = [r for r in rules if r.id not in settled]
    levels_for: dict[float, list[float]] = {}

    def judged(rule: Hypothesis, level: float) -> Judged:
        return _judge_rule(rule, diffs[rule.id], level, design, family, look, rule.id in at_margin)

    def level(alpha: float) -> float:
        if design.type == "anytime":  # a confidence sequence is valid at every look at its own alpha
            return alpha
        if alpha not in levels_for:
            levels_for[alpha] = design.levels(alpha)
        return levels_for[alpha][look]

    if correction in ("bh", "bh_spent"):
        # BH at the look's level q rejects the k rules with the smallest p-values, where k is the
        # largest i with p_(i) <= i q / m: exactly the rules whose p is <= k q / m, so every interval
        # is shown at level k q / m (q / m when none is rejected). q: the look's nominal level (bh),
        # or the alpha this look spends (bh_spent), which keeps the rate over the looks
        q = level(design.alpha) if correction == "bh" else design.spent(design.alpha)[look]
        m = max(len(open_rules), 1)
        p_of = {"t": t_p_value, "sign": sign_p_value}
        # a sign test with every difference 0 has no p-value (nan); it is no evidence, p = 1, and a
        # nan must not reach the step-up, where it would void every other rule's adjusted p-value
        p_values = [p_of[r.test](diffs[r.id]) for r in open_rules]
        adjusted = benjamini_hochberg([1.0 if math.isnan(p) else p for p in p_values])
        k = max(sum(a <= q for a in adjusted), 1)
        out = {r.id: judged(r, k * q / m) for r in open_rules}
    else:
        out = _step_down(open_rules, len(rules), correction, design.alpha, judged, level)
    return [settled.get(r.id) or out[r.id] for r in rules]


def _step_down(
    open_rules: list[Hypothesis],
    family_size: int,
    correction: str,
    alpha: float,
    judged: Callable[[Hypothesis, float], Judged],
    level: Callable[[float], float],
) -> dict[str, Judged]:
    """Holm: alpha / r for each of the r open rules, again with the rest while some settle;
    Bonferroni: alpha / m for each of the family's m rules; none: alpha each."""
    out: dict[str, Judged] = {}
    remaining = list(open_rules)
    while remaining:
        share = {"holm": alpha / len(remaining), "bonferroni": alpha / family_size}.get(correction, alpha)
        results = {r.id: judged(r, level(share)) for r in remaining}
        out.update(results)
        settled_now = {r.id for r in remaining if results[r.id].outcome in SETTLED}
        if correction != "holm" or not settled_now:
            break
        remaining = [r for r in remaining if r.id not in settled_now]
    return out


def judge_looks(
    diffs_by_seed: dict[str, dict[int, float]],
    rules_file: RulesFile,
    seeds: Sequence[int],
) -> list[list[Judged]]:
    """Every planned look the given seeds reach, in order: the look at n seeds reads the first n of
    ``seeds`` (seed order). ``diffs_by_seed[rule id][seed]`` is the rule's per-seed difference."""
    design = rules_file.design
    assert design is not None
    seeds = sorted(seeds)
    settled: dict[str, Judged] = {}
    looks = []
    for k, n in enumerate(design.looks):
        if n > len(seeds):
            break
        chosen = seeds[:n]
        diffs = {r.id: [diffs_by_seed[r.id][s] for s in chosen] for r in rules_file.rules}
        judged: list[Judged] = []
        for family, correction in design.families.items():
            members = [r for r in rules_file.rules if rules_file.families[r.id] == family]
            if members:
                judged += _judge_family(
                    members, diffs, design, k, correction, settled, family, rules_file.decide_at_margin
                )
        for j in judged:
            if j.outcome in SETTLED and j.rule.id not in settled:
                settled[j.rule.id] = j
        order = {r.id: i for i, r in enumerate(rules_file.rules)}
        looks.append(sorted(judged, key=lambda j: order[j.rule.id]))
    return looks


def complete_seeds(diffs_by_seed: dict[str, dict[int, float]]) -> list[int]:
    """The seeds, in order, on which every rule has its per-seed difference."""
    return sorted(set.intersection(*(set(v) for v in diffs_by_seed.values()))) if diffs_by_seed else []


def log_looks(
    log: Path, looks: Sequence[Sequence[Judged]], design: Design, seeds: Sequence[int]
) -> list[int]:
    """Append every look reached to the looks log (each once); returns the looks newly written
    (1-based). ``seeds``: the complete seeds in order, the look at n seeds reading the first n."""
    return [
        i + 1 for i, judged in enumerate(looks) if append_look(log, seeds[: design.looks[i]], i + 1, judged)
    ]


def primary_done(look: Sequence[Judged] | Sequence[dict[str, Any]]) -> bool:
    """Whether every primary rule is decided, decided against or ruled out at one look: its rules
    judged now, or their records in the looks log (``Judged.record``)."""
    pairs = [(r["family"], r["outcome"]) if isinstance(r, dict) else (r.family, r.outcome) for r in look]
    return all(outcome in STOPPING for family, outcome in pairs if family == "primary")


def descriptive(diffs: dict[str, list[float]], rules_file: RulesFile) -> list[Judged]:
    """Every rule at 95% with no outcome: a look the design did not plan, or a file with no design."""
    out = []
    for rule in rules_file.rules:
        d = diffs[rule.id]
        estimate, low, high = _interval(rule, d, 0.05)
        out.append(
            _judged(
                rule, rules_file.families[rule.id], d, estimate, low, high, math.nan, "descriptive only", None
            )
        )
    return out


def seeds_range(j: Judged) -> str:
    """Seeds a new study of one look would need to settle the rule at 80% power if the observed
    difference were true, over the 95% interval of the s.d. (4 degrees of freedom at 5 seeds); for
    a sign-test rule, at the observed shares of seeds above, at and below 0."""
    if j.rule.test == "sign":
        return "" if j.sign_seeds is None else str(j.sign_seeds)
    if j.seeds < 2 or math.isnan(j.sd) or j.sd == 0:
        return ""
    bound = -j.rule.margin if j.rule.expect == "not_below" else 0.0
    distance = j.estimate - bound
    df = j.seeds - 1
    low_sd = j.sd * math.sqrt(df / chi2_ppf(0.975, df))
    high_sd = j.sd * math.sqrt(df / chi2_ppf(0.025, df))
    few, many = seeds_needed(distance, low_sd), seeds_needed(distance, high_sd)
    if few is None or many is None:
        return "more than 100,000"
    return f"{few}-{many}"


def judged_header(unit: str = "seeds") -> list[str]:
    """The decision table's header; ``unit`` names what a rule's n counts (seeds for training
    studies, problems for an exploration judged with problems as the unit)."""
    return [
        "rule",
        "family",
        "pair",
        "metric",
        "expect (δ)",
        "difference",
        "interval",
        "level",
        unit,
        "p (t / sign-flip)",
        "outcome",
        f"a new study would need ({unit})",
    ]


def judged_rows(judged: Sequence[Judged]) -> list[list[str]]:
    rows = []
    for j in judged:
        rule = j.rule
        expect = {"greater": "> 0", "less": "< 0", "not_below": "> -δ"}[rule.expect]
        flip = "" if j.p_sign_flip is None else f" / {j.p_sign_flip:.3g}"
        outcome = j.outcome + (f" (look {j.look})" if j.look else "")
        interval = "" if math.isnan(j.low) else f"[{j.low:+.3f}, {j.high:+.3f}]"
        rows.append(
            [
                rule.id,
                j.family,
                f"{rule.variant} - {rule.baseline}",
                metric_label(rule),
                f"{expect} ({rule.margin:g})",
                f"{j.estimate:+.3f}",
                interval,
                "95% (none)" if math.isnan(j.level) else f"{1 - j.level:.2%}",
                str(j.seeds),
                _p_text(j) + flip,
                outcome,
                "" if j.outcome in SETTLED else seeds_range(j),
            ]
        )
    return rows


def _p_text(j: Judged) -> str:
    """The p-value cell: the t-test's, or for a sign-test rule the sign test's, so named."""
    if j.rule.test == "sign":
        return "" if math.isnan(j.p_sign) else f"{j.p_sign:.3g} (sign test)"
    return "" if math.isnan(j.p_t) else f"{j.p_t:.3g}"


def read_looks(log: Path) -> list[dict[str, Any]]:
    """The looks log's entries in order; none when there is no log yet."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def append_look(log: Path, seeds: Sequence[int], look: int, judged: Sequence[Judged]) -> bool:
    """Append a planned look to the looks log unless the same look of the same seeds is there;
    True when written."""
    entries = read_looks(log)
    if any(e["look"] == look and e["seeds"] == list(seeds) for e in entries):
        return False
    if any(e["look"] == look for e in entries):
        raise ConfigError(
            f"{log} already holds look {look} with other seeds; a look is taken once (delete the log "
            "only if that look was never reported)"
        )
    entry = {
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "look": look,
        "seeds": list(seeds),
        "rules": [j.record() for j in judged],
    }
    with log.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")
    return True
