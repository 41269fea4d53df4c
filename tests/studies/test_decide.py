"""Pre-registered decision rules (semrl.studies.decide): the outcome against a literal reading of the
rules on many random studies, the rules file's checks, and `semrl compare --decide` end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from semrl.cli import main
from semrl.errors import ConfigError
from semrl.studies.decide import EXPECTATIONS, Decision, Hypothesis, decide, decision_rows, load_hypotheses
from semrl.studies.discovery import Run
from semrl.studies.stats import compare_paired

ROOT = Path(__file__).resolve().parents[2]


def _reference(low: float, high: float, expect: str, margin: float) -> str:
    """docs/results.md's rules read literally, one expectation at a time."""
    ends = (low, high)
    if expect == "not_below":
        if low > -margin:
            return "decided"
        return "decided against" if high < -margin else "undecided"
    claimed = (lambda x: x > 0) if expect == "greater" else (lambda x: x < 0)
    opposite = (lambda x: x < 0) if expect == "greater" else (lambda x: x > 0)
    if all(claimed(x) for x in ends):
        return "decided"
    if all(opposite(x) for x in ends):
        return "decided against"
    if all(-margin < x < margin for x in ends):
        return "ruled out"
    return "undecided"


def test_outcomes_match_the_rules_read_literally_on_random_studies():
    rng = np.random.default_rng(0)
    seen = set()
    for case in range(3000):
        seeds = int(rng.integers(2, 11))
        margin = float(rng.choice([0.02, 0.05, 0.5, 5.0]))
        scale = margin * float(rng.choice([0.1, 1.0, 4.0]))
        kind = case % 5
        if kind == 0:  # every seed agrees exactly: s.d. 0, the interval is a point
            d = np.full(seeds, float(rng.normal(0, scale)))
        elif kind == 1:  # no difference at all
            d = np.zeros(seeds)
        elif kind == 2:  # differences on a grid, as pass@k over a fixed number of problems
            d = rng.integers(-3, 4, seeds) / 32
        else:
            d = rng.normal(rng.normal(0, scale), scale, seeds)
        c = compare_paired(d.tolist())
        for expect in EXPECTATIONS:
            outcome = decide(c, expect, margin)
            assert outcome == _reference(c.low, c.high, expect, margin), (d, expect, margin)
            seen.add((expect, outcome))
    assert len(seen) == 11  # every outcome of every expectation (not_below has no "ruled out")


def test_one_seed_is_undecided_and_a_bad_expectation_is_refused():
    c = compare_paired([0.5])
    assert math.isnan(c.low) and all(decide(c, e, 0.1) == "undecided" for e in EXPECTATIONS)
    with pytest.raises(ValueError, match="expect must be one of"):
        decide(compare_paired([0.1, 0.2]), "bigger", 0.1)  # type: ignore[arg-type]


def _fewest_seeds_by_power(effect: float, sd: float) -> int | None:
    """Read off scipy's noncentral t at every n from 2 to 199 at once: the fewest seeds at which the
    two-sided paired t-test at 5% rejects with probability >= 0.8."""
    from scipy import stats as st

    if effect == 0:
        return None
    n = np.arange(2, 200)
    critical = st.t.ppf(0.975, n - 1)
    shift = abs(effect) * np.sqrt(n) / sd
    lower = np.nan_to_num(st.nct.cdf(-critical, n - 1, shift), nan=0.0)
    reached = np.flatnonzero(st.nct.sf(critical, n - 1, shift) + lower >= 0.8)
    return int(n[reached[0]]) if reached.size else None


def test_an_undecided_rule_names_the_seeds_from_its_own_bound_and_which_way_they_would_decide():
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(150):
        seeds = int(rng.integers(3, 8))
        margin = float(rng.choice([0.02, 0.05, 0.1]))
        d = rng.normal(rng.normal(0, 0.05), 0.08, seeds)
        c = compare_paired(d.tolist())
        for expect in EXPECTATIONS:
            if decide(c, expect, margin) != "undecided":
                continue
            rule = Hypothesis("H", "", "eval/pass@1", "a", "b", expect, margin)  # type: ignore[arg-type]
            (row,) = decision_rows([Decision(rule, c, "undecided")])
            # the distance that must be resolved is from 0, or from -δ for non-inferiority
            distance = c.estimate + (margin if expect == "not_below" else 0.0)
            needed = _fewest_seeds_by_power(distance, float(np.std(d, ddof=1)))
            if needed is None:  # beyond 200 seeds: not counted here
                continue
            toward_claim = distance < 0 if expect == "less" else distance > 0
            if toward_claim:
                assert row[-1] == f"undecided: {needed} seeds needed at 80% power", (d, expect, margin)
            else:
                assert row[-1] == (
                    f"undecided: points against the claim: {needed} seeds would decide it against at 80% power"
                ), (d, expect, margin)
            seen.add((expect, toward_claim))
    assert len(seen) == 6  # both directions of every expectation


RULE = {
    "id": "H1",
    "claim": "x",
    "metric": "eval/pass@1",
    "pair": ["a", "b"],
    "expect": "greater",
    "margin": 0.05,
}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"expect": "bigger"}, "'expect' must be one of greater, less, not_below"),
        ({"margin": 0}, "'margin' must be a number > 0"),
        ({"margin": True}, "'margin' must be a number > 0"),
        ({"pair": ["a"]}, "'pair' must be \\[variant, baseline\\]"),
        ({"window": 0}, "'window' must be an integer >= 1"),
        ({"metirc": "x"}, "unknown keys \\['metirc'\\]"),
        ({"metric": None, "_drop": "metric"}, "missing keys \\['metric'\\]"),
    ],
)
def test_a_bad_rule_names_the_rule_and_the_key(tmp_path, change, message):
    rule = {**RULE, **change}
    if "_drop" in rule:
        del rule[rule.pop("_drop")]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump([RULE | {"id": "ok"}, rule]))
    with pytest.raises(ConfigError, match=f"rule 2: {message}"):
        load_hypotheses(path)


def test_a_bad_rules_file_says_what_is_wrong(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_hypotheses(tmp_path / "none.yaml")
    (tmp_path / "empty.yaml").write_text("{}\n")
    with pytest.raises(ConfigError, match="non-empty list"):
        load_hypotheses(tmp_path / "empty.yaml")
    (tmp_path / "twice.yaml").write_text(yaml.safe_dump([RULE, RULE]))
    with pytest.raises(ConfigError, match="rule ids repeat: \\['H1'\\]"):
        load_hypotheses(tmp_path / "twice.yaml")


def test_study_2s_rules_file_holds_the_pre_registered_table():
    """13 comparisons (C 1, H1 6, H2 2, H3 2, H4a 1, H4b 1) over the sweep's variants."""
    rules = load_hypotheses(ROOT / "configs" / "study" / "study_sparse_rules.yaml")
    variants = set(yaml.safe_load((ROOT / "configs" / "study_sparse.yaml").read_text())["variants"])
    assert len(rules) == 13 and {name for r in rules for name in (r.variant, r.baseline)} <= variants
    margins = {r.id.split("-")[0]: r.margin for r in rules}
    assert margins == {"C": 0.02, "H1": 0.05, "H2": 0.5, "H3": 5.0, "H4a": 0.1, "H4b": 0.05}
    assert [r.window for r in rules if r.id == "H4a"] == [10]


def _sweep(root: Path) -> Path:
    """5 seeds: `better` lifts pass@1 by 0.3 (+- 0.02), `same` differs by at most 0.002 and 0 on
    average; the entropy is logged over 12 steps."""
    rng = np.random.default_rng(3)
    for seed, offset in enumerate((0.002, -0.002, 0.001, -0.001, 0.0)):
        base = float(rng.uniform(0.1, 0.4))
        for variant, lift, noise in (("base", 0.0, 0.0), ("better", 0.3, 0.02), ("same", offset, 0.0)):
            run = root / variant / f"seed-{seed}"
            run.mkdir(parents=True)
            rows = [
                {"step": s, "entropy": 1.0 + (s / 10 if variant == "better" else 0.0)} for s in range(1, 13)
            ]
            rows[-1]["eval/pass@1"] = base + lift + float(rng.normal(0, noise))
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (run / "sweep_done.json").write_text("{}")
    return root


def test_compare_decide_judges_each_rule_end_to_end(tmp_path, capsys):
    sweep = _sweep(tmp_path / "sweep")
    rules = [
        RULE | {"id": "lift", "pair": ["better", "base"]},
        RULE | {"id": "reverse", "pair": ["base", "better"]},
        RULE | {"id": "none", "pair": ["same", "base"]},
        RULE | {"id": "noninf", "pair": ["same", "base"], "expect": "not_below"},
        RULE | {"id": "ent", "metric": "entropy", "pair": ["better", "base"], "margin": 0.1, "window": 10},
        RULE | {"id": "ent-last3", "metric": "entropy", "pair": ["better", "same"], "window": 3},
        RULE | {"id": "later", "pair": ["better", "not_run_yet"]},
    ]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    out = tmp_path / "cmp"
    assert main(["compare", str(sweep), "--decide", str(path), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = {line.split(" | ")[0].strip("| "): line for line in printed.splitlines() if line.startswith("| ")}
    assert rows["lift"].endswith("| 5 | 5 / 0 / 0 | decided |")
    assert rows["reverse"].endswith("| decided against |")
    assert rows["none"].endswith("| ruled out |")
    assert rows["noninf"].endswith("| decided |")
    # better's entropy is 1 + step/10, the others' 1.0: over steps 3-12 the mean difference is 0.75,
    # over steps 10-12 it is 1.1 (the last step alone: 1.2)
    assert (
        "| +0.750 |" in rows["ent"]
        and "(last 10 steps)" in rows["ent"]
        and rows["ent"].endswith("| decided |")
    )
    assert "| +1.100 |" in rows["ent-last3"]
    assert rows["later"].endswith("| undecided: no seed finished both variants |")
    assert "7 rules: 4 decided, 1 decided against, 1 ruled out, 1 undecided" in printed
    assert "Decision rules" in (out / "results.md").read_text()
    assert main(["compare", str(sweep / "base" / "seed-0"), "--decide", str(path)]) == 2
    assert "--decide compares variants across seeds" in capsys.readouterr().err


def test_compare_draws_the_decisions_as_a_forest_plot(tmp_path):
    """`semrl compare --decide RULES --output DIR` with a design: figures/decisions.png first, its
    rows the look's estimate, the design's interval, the descriptive 95% t-interval and every seed's
    difference, computed here again from the run records with scipy."""
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_rgb
    from matplotlib.image import imread
    from scipy import stats as st

    from semrl.studies.comparison import design_section
    from semrl.studies.discovery import find_runs
    from semrl.studies.forest import forest_rows
    from semrl.studies.rules_file import load_rules
    from semrl.studies.runs import method_color
    from semrl.studies.seeds import compare_seeds

    sweep = _sweep(tmp_path / "sweep")
    path = tmp_path / "rules.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "design": {"type": "fixed", "looks": [5]},
                "families": {"primary": "holm", "secondary": "bh"},
                "rules": [
                    RULE | {"id": "lift", "pair": ["better", "base"], "family": "primary"},
                    RULE | {"id": "none", "pair": ["same", "base"], "family": "secondary"},
                ],
            }
        )
    )
    rules = load_rules(path)
    (_, _, rows), forest = design_section(find_runs([sweep]), rules, False, False, None)
    assert [r.label.split(":")[0] for r in forest] == ["lift", "none"]
    for row, table_row, variant in zip(forest, rows, ("better", "same"), strict=True):
        d = [
            json.loads((sweep / variant / f"seed-{s}" / "metrics.jsonl").read_text().splitlines()[-1])[
                "eval/pass@1"
            ]
            - json.loads((sweep / "base" / f"seed-{s}" / "metrics.jsonl").read_text().splitlines()[-1])[
                "eval/pass@1"
            ]
            for s in range(5)
        ]
        assert row.differences == pytest.approx(d) and row.estimate == pytest.approx(np.mean(d))
        half = st.t.ppf(0.975, 4) * np.std(d, ddof=1) / np.sqrt(5)
        assert row.descriptive == pytest.approx((np.mean(d) - half, np.mean(d) + half))
        assert f"[{row.design[0]:+.3f}, {row.design[1]:+.3f}]" in table_row
        assert (
            table_row[10].startswith(row.outcome) and row.variant == variant and row.margin == RULE["margin"]
        )
        half = st.t.ppf(1 - (1 - row.level) / 2, 4) * np.std(d, ddof=1) / np.sqrt(5)
        assert row.design == pytest.approx((np.mean(d) - half, np.mean(d) + half))
    out = tmp_path / "cmp"
    compare_seeds([sweep], out, rules=rules)
    figures = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("![")]
    assert figures[0] == "![decisions](figures/decisions.png)" and len(figures) > 1
    pixels = (imread(out / "figures" / "decisions.png")[..., :3] * 255).round()
    for variant in ("better", "same"):
        colour = np.array(to_rgb(method_color(variant))) * 255
        assert (np.abs(pixels - colour).max(axis=-1) <= 2).sum() >= 50, variant
    assert forest_rows([], {}) == []


def _curve_run(variant: str, seed: int, values: dict[int, float], samples: int = 8) -> Run:
    rows = [
        {"step": s, "eval/pass@1": v, "eval/pass@4": v, f"eval/mean@{samples}": v, "reward": 0.0}
        for s, v in values.items()
    ]
    return Run(variant, seed, Path(f"{variant}/seed-{seed}"), rows)


@pytest.mark.parametrize("seed", range(5))
def test_a_curve_rule_compares_the_mean_over_evaluations_after_step_0(seed):
    """over: curve (issue 62, item 3) reads each run's evaluations after step 0 and averages them,
    by hand on random curves; changing one checkpoint's value changes the difference by that change
    over the number of checkpoints, and the base evaluation (step 0) is not read."""
    from semrl.studies.comparison import decide_all, rule_differences
    from semrl.studies.decide import metric_label, parse_hypothesis

    rng = np.random.default_rng(seed)
    steps = [0, *sorted(rng.choice(np.arange(1, 60), size=rng.integers(1, 6), replace=False).tolist())]
    curves = {
        (v, s): dict(zip(steps, rng.uniform(0, 1, len(steps)), strict=True))
        for v in ("rose", "dr_grpo")
        for s in range(4)
    }
    groups = {v: [_curve_run(v, s, curves[v, s]) for s in range(4)] for v in ("rose", "dr_grpo")}
    rule = parse_hypothesis(
        {
            "id": "C1",
            "metric": "eval/pass@1",
            "pair": ["rose", "dr_grpo"],
            "expect": "greater",
            "margin": 0.05,
            "over": "curve",
        },
        "test",
    )
    by_hand = {
        s: float(np.mean([curves["rose", s][t] - curves["dr_grpo", s][t] for t in steps[1:]]))
        for s in range(4)
    }
    got = rule_differences(groups, [rule])["C1"]
    assert got.keys() == by_hand.keys() and all(math.isclose(got[s], by_hand[s], abs_tol=1e-12) for s in got)
    (decision,) = decide_all(groups, [rule])
    assert math.isclose(decision.comparison.estimate, float(np.mean(list(by_hand.values()))), abs_tol=1e-12)
    assert metric_label(rule) == "eval/pass@1 (mean over evaluations)"
    assert decision_rows([decision])[0][3] == "eval/pass@1 (mean over evaluations)"
    groups["rose"][0].rows[-1]["eval/pass@1"] += 0.3  # one checkpoint's record
    changed = rule_differences(groups, [rule])["C1"][0]
    assert math.isclose(changed - got[0], 0.3 / (len(steps) - 1), abs_tol=1e-12)
    groups["rose"][1].rows[0]["eval/pass@1"] += 0.3  # the base evaluation: not part of the curve
    assert rule_differences(groups, [rule])["C1"][1] == got[1]


def test_a_curve_rule_refuses_unequal_checkpoints_and_pass_at_k_from_fewer_than_2k_samples(tmp_path):
    from semrl.studies.comparison import rule_differences
    from semrl.studies.decide import parse_hypothesis

    def rule(metric: str, **extra) -> Hypothesis:
        return parse_hypothesis(
            {
                "id": "C1",
                "metric": metric,
                "pair": ["a", "b"],
                "expect": "greater",
                "margin": 0.05,
                "over": "curve",
                **extra,
            },
            "rules.yaml, rule 1",
        )

    a, b = _curve_run("a", 0, {0: 0.1, 10: 0.2, 20: 0.3}), _curve_run("b", 0, {0: 0.1, 10: 0.2})
    with pytest.raises(ConfigError, match=r"rule C1 \(over: curve\).*at steps \[10, 20\].*at \[10\]"):
        rule_differences({"a": [a], "b": [b]}, [rule("eval/pass@1")])
    b = _curve_run("b", 0, {0: 0.1, 10: 0.2, 20: 0.4})
    assert math.isclose(rule_differences({"a": [a], "b": [b]}, [rule("eval/pass@1")])["C1"][0], -0.05)
    four = {"a": [_curve_run("a", 0, {10: 0.5}, 4)], "b": [_curve_run("b", 0, {10: 0.4}, 4)]}
    with pytest.raises(ConfigError, match=r"eval/pass@4 from 4 samples per problem.*logging.eval_samples=8"):
        rule_differences(four, [rule("eval/pass@4")])
    assert rule_differences(four, [rule("eval/pass@1")])["C1"] == {0: pytest.approx(0.1)}
    assert rule_differences({"a": [a], "b": [b]}, [rule("eval/pass@4")])["C1"]  # 8 samples: enough
    with pytest.raises(ConfigError, match="'over' must be one of last, curve"):
        rule("eval/pass@1", over="area")
    with pytest.raises(ConfigError, match="leave out 'window'"):
        rule("eval/pass@1", window=3)


def _signal_run(variant: str, seed: int, silent: list[bool]) -> Run:
    """A run whose step s (1-based) had no reward signal when silent[s - 1]; step 0 has none to log."""
    rows = [{"step": 0, "eval/pass@1": 0.0}] + [
        {"step": s, "reward/frac_groups_all_equal": 1.0 if quiet else 0.25, "eval/pass@1": float(s)}
        for s, quiet in enumerate(silent, start=1)
    ]
    return Run(variant, seed, Path(f"{variant}/seed-{seed}"), rows)


@pytest.mark.parametrize("seed", range(4))
def test_collapsed_counts_runs_with_no_reward_signal_in_most_steps_and_a_sign_rule_reads_it(seed):
    """The run-level metric ``collapsed`` (issue 62, item 2) by hand on random runs: 1 when more than
    half the steps had every group's rewards equal; a rule on it with test: sign is the paired
    (McNemar) comparison of the collapses, its p-value the exact binomial test of the discordant
    seeds."""
    from scipy import stats as st

    from semrl.studies.comparison import decide_all, rule_differences
    from semrl.studies.decide import parse_hypothesis
    from semrl.studies.stats import sign_p_value

    rng = np.random.default_rng(seed)
    runs = {
        (v, s): rng.random(int(rng.integers(1, 12))) < rng.uniform(0, 1)
        for v in ("a", "b")
        for s in range(10)
    }
    groups = {v: [_signal_run(v, s, list(runs[v, s])) for s in range(10)] for v in ("a", "b")}
    by_hand = {key: float(silent.sum() > len(silent) / 2) for key, silent in runs.items()}
    assert all(r.collapsed() == by_hand[r.variant, r.seed] for rs in groups.values() for r in rs)
    rule = parse_hypothesis(
        {
            "id": "K",
            "metric": "collapsed",
            "pair": ["a", "b"],
            "expect": "less",
            "margin": 0.1,
            "test": "sign",
        },
        "test",
    )
    d = rule_differences(groups, [rule])["K"]
    assert d == {s: by_hand["a", s] - by_hand["b", s] for s in range(10)}
    (decision,) = decide_all(groups, [rule])
    c = decision.comparison
    assert (c.wins, c.ties, c.losses) == (
        sum(x > 0 for x in d.values()),
        sum(x == 0 for x in d.values()),
        sum(x < 0 for x in d.values()),
    )
    discordant = c.wins + c.losses  # McNemar: the seeds where one variant collapsed and the other did not
    if discordant:
        assert math.isclose(sign_p_value(list(d.values())), st.binomtest(c.wins, discordant).pvalue)
        assert c.estimate == float(np.median([x for x in d.values() if x != 0]))
    else:
        assert math.isnan(c.estimate) and decision.outcome == "undecided"
    assert decision_rows([decision])[0][3] == "collapsed, median"
    assert _signal_run("a", 0, []).collapsed() is None  # no reward/frac_groups_all_equal logged


def test_a_rule_refuses_an_unknown_test_and_a_collapse_over_a_curve():
    from semrl.studies.decide import parse_hypothesis

    base = {"id": "K", "metric": "collapsed", "pair": ["a", "b"], "expect": "less", "margin": 0.1}
    with pytest.raises(ConfigError, match="'test' must be one of t, sign, got 'wilcoxon'"):
        parse_hypothesis({**base, "test": "wilcoxon"}, "rules.yaml, rule 1")
    with pytest.raises(ConfigError, match="'collapsed' is one value per run.*leave out 'over' and 'window'"):
        parse_hypothesis({**base, "over": "curve"}, "rules.yaml, rule 1")
    with pytest.raises(ConfigError, match="'collapsed' is one value per run"):
        parse_hypothesis({**base, "window": 5}, "rules.yaml, rule 1")
