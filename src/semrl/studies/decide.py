"""Decision rules fixed before a study runs, applied to its paired seed-level comparisons.

A hypothesis names one paired difference (``variant - baseline`` of one metric, per seed), the
direction it expects and a margin δ. Its outcome, from the 95% paired t-interval of
``semrl.studies.stats`` (docs/evaluation.md, "Decision rules"):

- ``expect: greater``: **decided** if the interval lies above 0, **decided against** if below 0,
  **ruled out** if it lies inside (-δ, +δ), else **undecided**.
- ``expect: less``: the same with the signs swapped.
- ``expect: not_below`` (non-inferiority): **decided** if the interval's lower end is above -δ,
  **decided against** if its upper end is below -δ, else **undecided**.

An undecided outcome carries the seeds at which the observed difference, taken as the truth with the
observed s.d., would settle the rule 80% of the time: its distance from the rule's bound (0, or -δ for
``not_below``), and whether that would decide for the claim or against it.

The rules file is YAML, a list of entries such as:

```yaml
- id: H1
  claim: ROSE has a higher pass@16
  metric: eval/pass@16
  pair: [rose, grpo]          # rose - grpo, per seed
  expect: greater
  margin: 0.05
  window: 1                   # training metrics: mean over each run's last N steps
  over: last                  # or curve: the mean over every evaluation after step 0
  test: t                     # or sign: the median difference, by the exact sign test
```

``over: curve`` compares a run's learning curve rather than its last point: the mean of the metric
over every evaluation after step 0 (``logging.eval_every``), the area under the curve per
evaluation. The two runs of a seed must have evaluated at the same steps, and a ``pass@k`` curve
needs at least 2k samples per problem (``logging.eval_samples``): pass@k from n = k samples is
only whether any sample was correct, the noisiest of the estimator's forms.

``test`` picks what the rule's interval is about (docs/evaluation.md, "Designs"):

- ``t`` (default): the mean difference, by the t-interval. It assumes the per-seed differences are
  near normal; one seed far out (a run that stopped learning) pushed its error rate to 0.11-0.15 at
  alpha 0.05 in simulation (tests/studies/test_error_rates.py).
- ``sign``: the median difference, by the order-statistic interval dual to the exact sign test
  (``semrl.studies.stats.median_interval``). It assumes only independent seeds, and holds its
  rate for any shape of the differences; it needs 6 seeds to reach 0.05, and with normal
  differences it has less power (0.70 against the t-test's 0.88 at a shift of 1 s.d. over 12
  seeds).

The run-level metric ``collapsed`` is 1 for a run that had no reward signal (every group's rewards
equal, ``reward/frac_groups_all_equal`` = 1) in more than half of its steps, else 0: a rule on it,
with ``test: sign``, pre-registers the collapse itself as an outcome (an exact McNemar test of the
paired collapses), so that collapsed seeds are counted, never dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from semrl.errors import ConfigError
from semrl.studies.stats import MAX_SEEDS, PairedComparison, seeds_needed
from semrl.tracking import metric_names as names

Expectation = Literal["greater", "less", "not_below"]
EXPECTATIONS: tuple[str, ...] = ("greater", "less", "not_below")
OVER: tuple[str, ...] = ("last", "curve")
TESTS: tuple[str, ...] = ("t", "sign")
COLLAPSED = "collapsed"  # the run-level metric of a run with no reward signal in most steps
NO_SIGNAL = names.ALL_EQUAL  # 1: every group's rewards equal, so no policy gradient


@dataclass(frozen=True)
class Hypothesis:
    """One pre-registered decision rule.

    Attributes:
        id: its name in the write-up (``H1``).
        claim: what it says, in words.
        metric: the metric compared (``eval/pass@16``, ``transfer/pass@1``, ``entropy``).
        variant: the variant; the per-seed difference is variant - baseline.
        baseline: what it is compared with.
        expect: ``greater`` (the difference is > 0), ``less`` (< 0), or ``not_below`` (> -margin).
        margin: δ > 0, in the metric's units.
        window: compare a training metric as its mean over each run's last ``window`` steps.
        over: ``last`` (the last value, or the ``window`` mean) or ``curve`` (the mean over every
            evaluation after step 0; module docstring).
        test: ``t`` (the mean difference) or ``sign`` (the median, by the exact sign test).
    """

    id: str
    claim: str
    metric: str
    variant: str
    baseline: str
    expect: Expectation
    margin: float
    window: int = 1
    over: str = "last"
    test: str = "t"


def metric_label(rule: Hypothesis) -> str:
    """The rule's metric as the tables name it: with its window, or as a curve, and the median
    when the rule takes the sign test."""
    if rule.over == "curve":
        label = f"{rule.metric} (mean over evaluations)"
    else:
        label = rule.metric if rule.window == 1 else f"{rule.metric} (last {rule.window} steps)"
    return label + (", median" if rule.test == "sign" else "")


@dataclass(frozen=True)
class Decision:
    """A hypothesis, the comparison it was judged on, and the outcome."""

    hypothesis: Hypothesis
    comparison: PairedComparison | None  # None: no seed finished both variants
    outcome: str


def _bound(expect: Expectation, margin: float) -> float:
    """The value a rule's interval must clear: -margin for ``not_below``, 0 otherwise."""
    return -margin if expect == "not_below" else 0.0


def decide(comparison: PairedComparison, expect: Expectation, margin: float) -> str:
    """The outcome of one rule: ``decided``, ``decided against``, ``ruled out`` or ``undecided``."""
    if expect not in EXPECTATIONS:
        raise ValueError(f"expect must be one of {', '.join(EXPECTATIONS)}, got '{expect}'")
    low, high = comparison.low, comparison.high
    if math.isnan(low) or math.isnan(high):  # one seed: no interval
        return "undecided"
    # every rule becomes "the interval lies above `bound`", with the interval turned to the claim
    toward = (-high, -low) if expect == "less" else (low, high)
    bound = _bound(expect, margin)
    if toward[0] > bound:
        return "decided"
    if toward[1] < bound:
        return "decided against"
    if expect != "not_below" and -margin < low and high < margin:
        return "ruled out"
    return "undecided"


def seeds_to_settle(
    comparison: PairedComparison, expect: Expectation, margin: float
) -> tuple[int | None, bool]:
    """(seeds, for_the_claim): the fewest seeds at which the observed difference, with the observed
    s.d., would carry the interval past the rule's bound (0, or -margin for ``not_below``) with
    probability 0.8 (``stats.seeds_needed``; None when it lies on the bound or needs more than
    MAX_SEEDS), and whether on the claim's side of it (decided) or the other (decided against)."""
    distance = comparison.estimate - _bound(expect, margin)
    for_the_claim = distance < 0 if expect == "less" else distance > 0
    return seeds_needed(distance, comparison.sd), for_the_claim


def parse_hypothesis(entry: Any, where: str) -> Hypothesis:
    """One rule of a rules file, checked; ``where`` names it in an error (file and rule number)."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: each rule is a mapping with id, claim, metric, pair, expect, margin")
    known = {f.name for f in fields(Hypothesis)} - {"variant", "baseline"} | {"pair"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; the keys are {sorted(known)}")
    missing = sorted({"id", "metric", "pair", "expect", "margin"} - set(entry))
    if missing:
        raise ConfigError(f"{where}: missing keys {missing}")
    pair = entry["pair"]
    if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
        raise ConfigError(f"{where}: 'pair' must be [variant, baseline], got {pair!r}")
    if entry["expect"] not in EXPECTATIONS:
        choices = ", ".join(EXPECTATIONS)
        raise ConfigError(f"{where}: 'expect' must be one of {choices}, got {entry['expect']!r}")
    margin = entry["margin"]
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not margin > 0:
        raise ConfigError(f"{where}: 'margin' must be a number > 0, got {margin!r}")
    window = entry.get("window", 1)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"{where}: 'window' must be an integer >= 1, got {window!r}")
    over = entry.get("over", "last")
    if over not in OVER:
        raise ConfigError(f"{where}: 'over' must be one of {', '.join(OVER)}, got {over!r}")
    if over == "curve" and window != 1:
        raise ConfigError(f"{where}: 'over: curve' takes every evaluation after step 0; leave out 'window'")
    test = _test(entry, over, window, where)
    return Hypothesis(
        id=str(entry["id"]),
        claim=str(entry.get("claim", "")),
        metric=str(entry["metric"]),
        variant=pair[0],
        baseline=pair[1],
        expect=entry["expect"],
        margin=float(margin),
        window=window,
        over=over,
        test=test,
    )


def _test(entry: dict[str, Any], over: str, window: int, where: str) -> str:
    """The rule's ``test``, checked, and that a ``collapsed`` rule reads one value per run."""
    test = entry.get("test", "t")
    if test not in TESTS:
        raise ConfigError(f"{where}: 'test' must be one of {', '.join(TESTS)}, got {test!r}")
    if entry["metric"] == COLLAPSED and (over != "last" or window != 1):
        raise ConfigError(
            f"{where}: '{COLLAPSED}' is one value per run (no reward signal in most steps); leave out "
            "'over' and 'window'"
        )
    return str(test)


def load_hypotheses(path: str | Path) -> list[Hypothesis]:
    """The rules of a YAML file (a list of entries, see the module's docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"decision rules file '{path}' does not exist")
    entries = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: expected a non-empty list of rules")
    rules = [parse_hypothesis(entry, f"{path}, rule {i + 1}") for i, entry in enumerate(entries)]
    ids = [r.id for r in rules]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{path}: rule ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return rules


DECISION_HEADER = [
    "rule",
    "claim",
    "pair",
    "metric",
    "expect (δ)",
    "difference",
    "95% t-interval",
    "seeds",
    "wins / ties / losses",
    "outcome",
]


def decision_rows(decisions: Sequence[Decision]) -> list[list[str]]:
    """One Markdown row per decision; an undecided one names the seeds it would need."""
    rows = []
    for dec in decisions:
        rule, c = dec.hypothesis, dec.comparison
        expect = {"greater": "> 0", "less": "< 0", "not_below": "> -δ"}[rule.expect]
        metric = metric_label(rule)
        outcome = dec.outcome
        if outcome == "undecided":
            outcome += ": " + _seeds_needed(c, rule)
        rows.append(
            [
                rule.id,
                rule.claim,
                f"{rule.variant} - {rule.baseline}",
                metric,
                f"{expect} ({rule.margin:g})",
                "" if c is None else f"{c.estimate:+.3f}",
                "" if c is None else c.interval_text,
                "0" if c is None else str(c.seeds),
                "" if c is None else c.agreement_text,
                outcome,
            ]
        )
    return rows


def _seeds_needed(c: PairedComparison | None, rule: Hypothesis) -> str:
    if c is None:
        return "no seed finished both variants"
    if c.seeds < 2:
        return "1 seed, no interval"
    if rule.test == "sign":  # the sign test's power, at the observed share of seeds above 0
        seeds = c.seeds_needed
        for_the_claim = c.wins < c.losses if rule.expect == "less" else c.wins > c.losses
        if seeds is None:
            return "as many seeds above 0 as below, or more than 10,000 seeds needed"
    else:
        seeds, for_the_claim = seeds_to_settle(c, rule.expect, rule.margin)
    if seeds is None:
        return f"on the bound, or more than {MAX_SEEDS} seeds needed"
    if for_the_claim:
        return f"{seeds} seeds needed at 80% power"
    return f"points against the claim: {seeds} seeds would decide it against at 80% power"


def decision_summary(decisions: Sequence[Decision]) -> str:
    """How many rules ended in each outcome (the multiplicity line of a write-up)."""
    counts: dict[str, int] = {}
    for dec in decisions:
        counts[dec.outcome] = counts.get(dec.outcome, 0) + 1
    parts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    return f"{len(decisions)} rules: {parts}; none corrected for multiplicity"
