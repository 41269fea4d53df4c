"""Group-sequential designs (semrl.studies.sequential, semrl.studies.designs): boundaries against
published tables and simulation, error rates and power of the t-calibrated looks by simulation,
Holm and BH against statsmodels, the sign-flip p against enumeration, the outcome precedence over
every region, multiplicity within a look, and the looks log."""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

from semrl.errors import ConfigError
from semrl.studies import sequential
from semrl.studies.decide import Hypothesis
from semrl.studies.designs import append_look, judge_looks, outcome_of
from semrl.studies.rules_file import Design, RulesFile, load_rules
from semrl.studies.sequential import (
    CALIBRATION_DRAWS,
    _crossing_probabilities,
    _look_moments,
    benjamini_hochberg,
    boundaries,
    holm,
    nominal_levels,
    sign_flip_p_value,
    spent,
    spent_per_look,
)

# Jennison & Turnbull (2000), Tables 2.1 and 2.3: two-sided alpha 0.05, K equally spaced looks.
POCOCK = {2: 2.178, 3: 2.289, 4: 2.361, 5: 2.413}
OBRIEN_FLEMING = {2: 1.977, 3: 2.004, 4: 2.024, 5: 2.040}  # C; c_k = C sqrt(K / k)


@pytest.mark.parametrize("looks", [2, 3, 4, 5])
def test_classical_boundaries_match_the_published_tables(looks):
    seeds = [3 * k for k in range(1, looks + 1)]
    assert boundaries(seeds, 0.05, "pocock") == pytest.approx([POCOCK[looks]] * looks, abs=1.5e-3)
    expected = [OBRIEN_FLEMING[looks] * math.sqrt(looks / k) for k in range(1, looks + 1)]
    assert boundaries(seeds, 0.05, "obrien_fleming") == pytest.approx(expected, abs=2e-3)


@pytest.mark.parametrize("kind", ["spending_obrien_fleming", "spending_pocock"])
@pytest.mark.parametrize("looks", [(4, 8, 12), (3, 4, 5), (5, 10)])
def test_spending_boundaries_spend_what_the_function_says_in_a_brownian_simulation(kind, looks):
    """An independent check of the recursive integration: Brownian scores simulated at the looks
    cross each boundary first with the spending function's increments."""
    bounds = boundaries(looks, 0.05, kind)
    fractions = [n / looks[-1] for n in looks]
    increments = np.diff([0.0, *(spent(kind, t, 0.05) for t in fractions)])
    assert sum(_crossing_probabilities(bounds, list(map(float, looks)))) == pytest.approx(0.05, abs=1e-6)
    rng = np.random.default_rng(7)
    n = 400_000
    steps = np.diff([0, *looks])
    scores = np.cumsum(rng.standard_normal((n, len(looks))) * np.sqrt(steps), axis=1)
    z = scores / np.sqrt(looks)
    alive = np.ones(n, dtype=bool)
    for k, c in enumerate(bounds):
        crossed = alive & (np.abs(z[:, k]) >= c)
        se = math.sqrt(increments[k] * (1 - increments[k]) / n)
        assert crossed.mean() == pytest.approx(increments[k], abs=4 * se + 1e-5), k
        alive &= ~crossed
    if kind == "spending_obrien_fleming":  # its first boundary in closed form
        assert bounds[0] == pytest.approx(st.norm.ppf(0.975) / math.sqrt(fractions[0]), abs=1e-6)


@pytest.mark.parametrize("looks", [(5, 100), (2, 4, 40), (2, 512)])
def test_a_look_that_spends_nothing_has_no_boundary_and_the_looks_after_it_spend_the_rest(looks):
    """O'Brien-Fleming spending at an information fraction of 0.05 or less spends under 1e-15 (at
    0.05: about 2e-18): that look decides nothing (boundary inf), and each later look crosses with
    the spending function's increment."""
    bounds = boundaries(looks, 0.05, "spending_obrien_fleming")
    fractions = [n / looks[-1] for n in looks]
    increments = np.diff([0.0, *(spent("spending_obrien_fleming", t, 0.05) for t in fractions)])
    assert bounds[0] == math.inf and all(math.isfinite(c) for c in bounds[1:])
    crossings = _crossing_probabilities(bounds, list(map(float, looks)))
    assert crossings == pytest.approx(increments, abs=1e-9)
    if len(looks) == 2:  # all of alpha at the last look: the fixed design's boundary
        assert bounds[1] == pytest.approx(st.norm.ppf(0.975), abs=1e-6)


def _rejections(levels, looks, d):
    """Whether each simulated study (rows of d) crosses at some look, and the first look."""
    rejected = np.zeros(len(d), dtype=bool)
    for n, level in zip(looks, levels, strict=True):
        x = d[:, :n]
        t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
        rejected |= 2 * st.t.sf(np.abs(t), n - 1) < level
    return rejected


@pytest.mark.parametrize("looks", [(2,), (3, 4, 5), (2, 9, 10, 33), (7, 40)])
def test_the_calibrations_chunked_draws_are_one_draws_cumulative_sums_bit_for_bit(looks):
    """The calibration draws its simulated studies a chunk at a time; its running sums at each look are
    those of one (CALIBRATION_DRAWS, n_K) draw's cumulative sums to the last bit, so that the levels
    of committed studies (Study 4a's looks of 256 and 512) stay what their records hold."""
    d = np.random.default_rng(20261125).standard_normal((CALIBRATION_DRAWS, looks[-1]))
    columns = np.asarray(looks) - 1
    sums, squares = _look_moments(looks)
    assert np.array_equal(sums, np.cumsum(d, axis=1)[:, columns])
    assert np.array_equal(squares, np.cumsum(d * d, axis=1)[:, columns])


def test_the_levels_are_their_definition_read_off_one_draw_which_every_alpha_and_boundary_shares(
    monkeypatch,
):
    """For two shares of alpha and two boundaries of one design, ``nominal_levels`` is its definition
    read off one (CALIBRATION_DRAWS, n_K) draw of the calibration's generator, with scipy's t: at
    each look the midpoint of the m-th and (m+1)-th smallest p-values of the studies that have not
    crossed before, m the look's spending increment times the draws. The studies are drawn once
    for all four (sequential._calibration_p_values), and reading them leaves them as they were."""
    looks = (3, 7)  # a design no other test calibrates
    d = np.random.default_rng(20261125).standard_normal((CALIBRATION_DRAWS, looks[-1]))
    p = np.stack(
        [
            2 * st.t.sf(np.abs(d[:, :n].mean(1)) / (d[:, :n].std(1, ddof=1) / math.sqrt(n)), n - 1)
            for n in looks
        ],
        axis=1,
    )
    draws = []
    monkeypatch.setattr(
        sequential, "_look_moments", lambda looks: draws.append(looks) or _look_moments(looks)
    )
    sequential._calibration_p_values.cache_clear()
    for alpha, kind in itertools.product([0.05, 0.0125], ["spending_obrien_fleming", "pocock"]):
        alive, expected = np.ones(CALIBRATION_DRAWS, dtype=bool), []
        for k, increment in enumerate(spent_per_look(looks, alpha, kind)):
            m = round(increment * CALIBRATION_DRAWS)
            candidates = np.sort(p[alive, k])
            expected.append((candidates[m - 1] + candidates[m]) / 2)
            alive &= ~(p[:, k] < expected[-1])
        assert nominal_levels.__wrapped__(looks, alpha, kind) == pytest.approx(expected, rel=1e-9), (
            alpha,
            kind,
        )
    assert draws == [looks]


@pytest.mark.parametrize("kind", ["spending_obrien_fleming", "pocock"])
@pytest.mark.parametrize("looks", [(4, 8, 12), (3, 4, 5)])
def test_false_decisions_stay_within_alpha_and_the_power_is_near_the_fixed_design(kind, looks):
    """20,000 simulated null studies (other draws than the calibration's): normal per-seed
    differences within alpha's Monte Carlo error, heavy-tailed (t with 3 d.f.) below it; the power
    at an effect of one s.d. within 0.08 of a single look at the last look's seeds for O'Brien-Fleming
    spending and within 0.15 for Pocock (which spends early and loses more, Jennison & Turnbull 2.2)."""
    levels = nominal_levels(looks, 0.05, kind)
    rng = np.random.default_rng(11)
    n = 20_000
    se = math.sqrt(0.05 * 0.95 / n)
    normal = _rejections(levels, looks, rng.standard_normal((n, looks[-1]))).mean()
    assert abs(normal - 0.05) < 3.5 * se
    assert _rejections(levels, looks, rng.standard_t(3, (n, looks[-1]))).mean() < 0.05 + 3 * se
    power = _rejections(levels, looks, 1.0 + rng.standard_normal((n, looks[-1]))).mean()
    m = looks[-1]
    fixed = st.nct.sf(st.t.ppf(0.975, m - 1), m - 1, math.sqrt(m)) + st.nct.cdf(
        -st.t.ppf(0.975, m - 1), m - 1, math.sqrt(m)
    )
    assert fixed - (0.08 if kind == "spending_obrien_fleming" else 0.15) < power
    assert power <= fixed + 3 * math.sqrt(fixed * (1 - fixed) / n)
    # the uncalibrated z levels let more through with few seeds: what the calibration is for
    if looks == (3, 4, 5) and kind == "spending_obrien_fleming":
        z_levels = [2 * st.norm.sf(c) for c in boundaries(looks, 0.05, kind)]
        assert _rejections(z_levels, looks, rng.standard_normal((n, m))).mean() > 0.05 + 3 * se


def test_holm_and_bh_match_statsmodels(monkeypatch):
    multipletests = pytest.importorskip("statsmodels.stats.multitest").multipletests
    # multipletests runs a full garbage collection per call: 0.2 s each in a worker that holds torch
    monkeypatch.setattr("gc.collect", lambda generation=2: 0)
    rng = np.random.default_rng(3)
    for _ in range(60):
        m = int(rng.integers(1, 15))
        p = rng.uniform(size=m) ** rng.uniform(0.5, 4)
        if rng.uniform() < 0.3:
            p[rng.integers(0, m)] = p[0]  # ties
        assert holm(p) == pytest.approx(multipletests(p, method="holm")[1].tolist(), abs=1e-12)
        assert benjamini_hochberg(p) == pytest.approx(
            multipletests(p, method="fdr_bh")[1].tolist(), abs=1e-12
        )


def test_sign_flip_p_value_equals_full_enumeration():
    rng = np.random.default_rng(5)
    for n in range(1, 9):
        for _ in range(20):
            d = rng.normal(0.3, 1.0, n).round(int(rng.integers(0, 3)))  # ties and zeros too
            count = 0
            for signs in itertools.product((1, -1), repeat=n):
                flipped = sum(s * x for s, x in zip(signs, d, strict=True))
                count += abs(flipped) >= abs(d.sum()) - 1e-9
            assert sign_flip_p_value(d) == pytest.approx(count / 2**n)
    assert sign_flip_p_value([1.0] * 5) == pytest.approx(2 / 32)  # 0.0625: 5 seeds cannot reach 0.05
    with pytest.raises(ValueError, match="12"):
        sign_flip_p_value(np.ones(13))


def _literal_outcome(low, high, expect, margin, at_margin):
    """The precedence of docs/evaluation.md read literally, written apart from outcome_of."""
    if expect == "greater":
        if low > (margin if at_margin else 0):
            return "decided"
        if high < 0:
            return "decided against"
    elif expect == "less":
        if high < (-margin if at_margin else 0):
            return "decided"
        if low > 0:
            return "decided against"
    else:
        if low > -margin:
            return "decided"
        if high < -margin:
            return "decided against"
        return "undecided"
    if -margin < low and high < margin:
        return "ruled out"
    return "undecided"


def test_outcomes_are_exclusive_with_the_written_precedence_over_every_region():
    points = [-0.3, -0.1, -0.05, -0.02, 0.0, 0.02, 0.05, 0.1, 0.3]
    seen = set()
    for expect in ("greater", "less", "not_below"):
        for at_margin in (False, True):
            rule = Hypothesis("r", "", "m", "a", "b", expect, 0.05)
            for low, high in itertools.combinations_with_replacement(points, 2):
                for lo, hi in (
                    (low - 1e-3, high + 1e-3),
                    (low + 1e-3, high - 1e-3) if high - low > 0.01 else (low, high),
                ):
                    got = outcome_of(lo, hi, rule, at_margin)
                    assert got == _literal_outcome(lo, hi, expect, 0.05, at_margin), (
                        expect,
                        at_margin,
                        lo,
                        hi,
                    )
                    seen.add(got)
    assert seen == {"decided", "decided against", "ruled out", "undecided"}
    # inside (0, margin): decided at zero, ruled out when the rule decides at its margin
    rule = Hypothesis("r", "", "m", "a", "b", "greater", 0.05)
    assert outcome_of(0.01, 0.04, rule) == "decided"
    assert outcome_of(0.01, 0.04, rule, decide_at_margin=True) == "ruled out"


def _rules(k: int, margin: float = 10.0) -> RulesFile:
    rules = tuple(Hypothesis(f"H{i}", "", "m", "a", "b", "greater", margin) for i in range(k))
    return RulesFile(None, rules, {r.id: "primary" for r in rules})


@pytest.mark.parametrize("correction", ["holm", "none"])
def test_holm_keeps_the_family_wise_error_and_none_does_not(correction):
    """Three primary rules, no effect anywhere, looks at 4 and 8 seeds: the chance that any rule
    is settled stays within alpha with Holm, and exceeds it uncorrected."""
    from dataclasses import replace

    design = Design("group_sequential", (4, 8), 0.05, "spending_obrien_fleming", {"primary": correction})
    rules = replace(_rules(3), design=design)
    rng = np.random.default_rng(1 if correction == "holm" else 2)
    studies, false = 1500, 0
    for _ in range(studies):
        d = rng.standard_normal((3, 8))
        diffs = {f"H{i}": dict(enumerate(d[i])) for i in range(3)}
        looks = judge_looks(diffs, rules, list(range(8)))
        false += any(j.outcome in ("decided", "decided against") for j in looks[-1])
    rate, se = false / studies, math.sqrt(0.05 * 0.95 / studies)
    if correction == "holm":
        assert rate < 0.05 + 2.5 * se
    else:
        assert rate > 0.09


def test_a_rule_settled_at_a_look_keeps_its_outcome_and_passes_on_its_alpha():
    from dataclasses import replace

    design = Design("group_sequential", (4, 8), 0.05, "spending_obrien_fleming", {"primary": "holm"})
    rules = replace(_rules(2, margin=0.01), design=design)
    strong = {s: 5.0 + 0.1 * s for s in range(8)}  # settled at look 1
    weak = {0: 1.0, 1: -1.0, 2: 0.5, 3: -0.3, 4: 0.2, 5: -0.1, 6: 0.4, 7: 0.0}  # open at both looks
    looks = judge_looks({"H0": strong, "H1": weak}, rules, list(range(8)))
    assert [j.outcome for j in looks[0]] == ["decided", "undecided"] and looks[0][0].look == 1
    assert looks[1][0] == looks[0][0]  # carried over unchanged
    # at look 2 the open rule is judged at the whole alpha's level, not half of it
    assert looks[1][1].level == pytest.approx(nominal_levels((4, 8), 0.05, "spending_obrien_fleming")[1])


def test_rules_files_with_designs_are_read_and_checked(tmp_path):
    path = tmp_path / "rules.yaml"
    body = {
        "design": {"type": "group_sequential", "looks": [4, 8], "boundary": "pocock", "max_hours": 12},
        "families": {"primary": "holm", "secondary": "bh"},
        "rules": [
            {
                "id": "H1",
                "metric": "eval/pass@16",
                "pair": ["rose", "dr_grpo"],
                "expect": "greater",
                "margin": 0.05,
            },
            {
                "id": "S1",
                "family": "secondary",
                "decide_at": "margin",
                "metric": "eval/pass@1",
                "pair": ["rose", "dr_grpo"],
                "expect": "greater",
                "margin": 0.05,
            },
        ],
    }
    import yaml

    path.write_text(yaml.safe_dump(body))
    rf = load_rules(path)
    assert rf.design.looks == (4, 8) and rf.design.max_hours == 12 and rf.design.families["secondary"] == "bh"
    assert rf.families == {"H1": "primary", "S1": "secondary"} and rf.decide_at_margin == {"S1"}
    for change, message in [
        ({"design": {"type": "adaptive", "looks": [4]}}, "type"),
        ({"design": {"type": "fixed", "looks": [4, 8]}}, "one look"),
        ({"design": {"type": "group_sequential", "looks": [8, 4]}}, "increase"),
        ({"design": {"type": "group_sequential", "looks": [4, 8], "boundary": "haybittle"}}, "boundary"),
        ({"families": {"secondary": "holm"}}, "primary"),
        ({"families": {"primary": "sidak"}}, "correction"),
        ({"design": {"type": "anytime", "looks": [4]}}, "max_seeds"),
        ({"design": {"type": "anytime", "max_seeds": 12}}, "not valid for e-values"),
    ]:
        path.write_text(yaml.safe_dump({**body, **change}))
        with pytest.raises(ConfigError, match=message):
            load_rules(path)
    path.write_text(yaml.safe_dump({**body, "rules": [{**body["rules"][0], "family": "tertiary"}]}))
    with pytest.raises(ConfigError, match="tertiary"):
        load_rules(path)


def test_the_looks_log_appends_each_look_once_and_refuses_a_look_taken_again(tmp_path):
    from dataclasses import replace

    design = Design("group_sequential", (2, 3), 0.05, "pocock", {"primary": "holm"})
    rules = replace(_rules(1), design=design)
    looks = judge_looks({"H0": {0: 0.1, 1: 0.3, 2: -0.2}}, rules, [0, 1, 2])
    log = tmp_path / "looks.jsonl"
    assert append_look(log, [0, 1], 1, looks[0]) and append_look(log, [0, 1, 2], 2, looks[1])
    assert not append_look(log, [0, 1], 1, looks[0])  # the same look again: nothing written
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["look"], e["seeds"]) for e in entries] == [(1, [0, 1]), (2, [0, 1, 2])]
    assert entries[1]["rules"][0]["id"] == "H0" and "level" in entries[1]["rules"][0]
    with pytest.raises(ConfigError, match="already holds look 1"):
        append_look(log, [0, 2], 1, looks[0])


def test_t_e_value_equals_the_bayes_factor_by_numerical_integration():
    """The closed form against the ratio of marginal likelihoods integrated numerically on a grid:
    effect delta ~ N(0, g) times the scale sigma, right-Haar prior 1/sigma on the scale (uniform in
    log sigma), on random data."""
    from semrl.studies.sequential import t_e_value

    rng = np.random.default_rng(4)
    deltas = np.linspace(-10, 10, 2001)
    log_s = np.linspace(-9, 7, 3201)
    sigma = np.exp(log_s)
    for n, g in ((2, 1.0), (3, 0.5), (5, 2.0), (4, 1.0)):
        x = rng.normal(rng.uniform(-1, 1), rng.uniform(0.5, 2), n)
        # log-likelihood of x given sigma and mean delta * sigma, on the (delta, log sigma) grid
        loglik = -n * np.log(sigma)[None, :] - (
            ((x[:, None, None] - deltas[None, :, None] * sigma[None, None, :]) ** 2).sum(0) / (2 * sigma**2)
        )
        prior = st.norm.pdf(deltas, 0, math.sqrt(g))[:, None]
        h1 = np.trapezoid(np.trapezoid(np.exp(loglik) * prior, deltas, axis=0), log_s)
        h0 = np.trapezoid(np.exp(-n * np.log(sigma) - (x**2).sum() / (2 * sigma**2)), log_s)
        assert t_e_value(x, g) == pytest.approx(h1 / h0, rel=1e-4)


def test_anytime_design_watched_at_every_seed_keeps_alpha_and_its_confidence_sequence_covers():
    """Null studies read at every seed from 2 to 20: the e-value crosses 1 / alpha in fewer than
    alpha of them (Ville's inequality), and the confidence sequence covers the true mean at every
    seed count at once in at least 1 - alpha; with an effect of one s.d., most studies stop early."""
    from semrl.studies.sequential import confidence_sequence, t_e_value

    rng = np.random.default_rng(9)
    studies, alpha = 1500, 0.05
    crossed = covered_always = stopped = 0
    for _ in range(studies):
        d = rng.standard_normal(20)
        crossed += any(t_e_value(d[:n]) >= 1 / alpha for n in range(2, 21))
        covered_always += all(
            (lambda c: c[1] <= 0 <= c[2])(confidence_sequence(d[:n], alpha)) for n in range(5, 21, 5)
        )
        shifted = d + 1.0
        stopped += any(t_e_value(shifted[:n]) >= 1 / alpha for n in range(2, 21))
    assert crossed / studies < alpha + 2 * math.sqrt(alpha * (1 - alpha) / studies)
    assert covered_always / studies >= 1 - alpha - 2 * math.sqrt(alpha * (1 - alpha) / studies)
    assert stopped / studies > 0.8


def test_anytime_rules_are_judged_at_every_seed_with_bonferroni(tmp_path):
    import yaml

    path = tmp_path / "rules.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "design": {"type": "anytime", "max_seeds": 10},
                "rules": [
                    {"id": f"H{i}", "metric": "m", "pair": ["a", "b"], "expect": "greater", "margin": 0.1}
                    for i in range(2)
                ],
            }
        )
    )
    rf = load_rules(path)
    assert rf.design.looks == tuple(range(2, 11)) and rf.design.families == {"primary": "bonferroni"}
    diffs = {"H0": {s: 1.0 + 0.1 * (s % 3) for s in range(10)}, "H1": {s: (-1) ** s * 0.3 for s in range(10)}}
    looks = judge_looks(diffs, rf, list(range(10)))
    assert len(looks) == 9  # a look at every seed count from 2
    first = next(k for k, look in enumerate(looks) if look[0].outcome == "decided")
    assert looks[first][0].level == pytest.approx(0.025)  # alpha / 2 rules
    assert all(look[0].outcome == "decided" for look in looks[first:])  # settled for good
    assert all(look[1].outcome in ("undecided", "ruled out") for look in looks)


@pytest.mark.e2e  # starts a process
def test_study3s_committed_looks_are_what_its_run_records_give(tmp_path):
    """scripts/check_look.py rebuilds every logged look of Study 3 from the raw per-problem records
    without semrl's code; a logged figure off by 1e-4, or a nan, is caught."""
    root = Path(__file__).parents[2]
    study, rules = root / "results" / "study3", root / "configs" / "study" / "study3_rules.yaml"
    script = [sys.executable, str(root / "scripts" / "check_look.py")]
    good = subprocess.run([*script, str(study), str(rules)], capture_output=True, text=True)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.count("matches") == 8 * good.stdout.count("look ")
    for variant in ("dr_grpo", "rose", "treepo"):
        (tmp_path / variant).symlink_to(study / variant)
    looks = [json.loads(line) for line in (study / "looks.jsonl").read_text().splitlines()]
    looks[0]["rules"][1]["estimate"] += 1e-4
    looks[0]["rules"][0]["p_t"] = math.nan
    (tmp_path / "looks.jsonl").write_text("".join(json.dumps(look) + "\n" for look in looks))
    bad = subprocess.run([*script, str(tmp_path), str(rules)], capture_output=True, text=True)
    assert bad.returncode == 1 and "MISMATCH estimate" in bad.stdout and "MISMATCH p_t" in bad.stdout


def _shown_equals(shown: str, value: float) -> bool:
    """A figure as the write-up prints it (``-0.007``, ``+5864``) is ``value`` rounded to its digits."""
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown) - value) <= 0.5 * 10.0**-decimals * (1 + 1e-9) + 1e-12


def test_study3s_write_up_tables_are_what_its_run_records_give():
    """Every look table in docs/results.md ("Study 3: look N at S seeds") shows, to its printed digits,
    the figures scripts/check_look.py rebuilds from the raw records: the difference, the interval at
    the look's level, the descriptive 95% interval, the seeds above / at / below 0, both p-values and
    the logged outcome, and the held-out means table (mean ± s.e. of pass@1 and pass@16). A digit
    copied wrong into the write-up fails here."""
    root = Path(__file__).parents[2]
    sys.path.insert(0, str(root / "scripts"))
    try:
        import check_look
    finally:
        sys.path.remove(str(root / "scripts"))
    study = root / "results" / "study3"
    looks = check_look.rebuild(study, root / "configs" / "study" / "study3_rules.yaml")
    text = (root / "docs" / "results.md").read_text()
    sections = re.split(r"^### ", text, flags=re.M)
    checked = 0
    for section in sections:
        head = re.match(r"Study 3: look (\d+) at (\d+) seeds\n", section)
        if not head:
            continue
        look = looks[int(head[1]) - 1]
        assert len(look["seeds"]) == int(head[2]), f"look {head[1]} was taken at {len(look['seeds'])} seeds"
        rows = {m[1]: m for m in re.finditer(r"^\| ([PS]\d) \|(.*)\|$", section, flags=re.M)}
        assert set(rows) == {r["logged"]["id"] for r in look["rules"]}, f"look {head[1]}: rules in the table"
        for mine in look["rules"]:
            cells = [c.strip() for c in rows[mine["logged"]["id"]][2].split("|")]
            _, difference, design, descriptive, counts, p_values, outcome = cells
            interval, interval95 = (
                re.fullmatch(r"\[(\S+), (\S+)\]", cell).groups() for cell in (design, descriptive)
            )
            shown = {
                "estimate": difference,
                **dict(zip(("low", "high"), interval, strict=True)),
                **dict(zip(("low95", "high95"), interval95, strict=True)),
                **dict(zip(("p_t", "p_sign_flip"), p_values.split(" / "), strict=True)),
            }
            where = f"look {head[1]}, {mine['logged']['id']}"
            for key, figure in shown.items():
                assert _shown_equals(figure, mine[key]), (
                    f"{where}: {key} shown {figure}, records give {mine[key]}"
                )
            assert tuple(map(int, counts.split(" / "))) == mine["above_at_below"], where
            assert outcome == mine["logged"]["outcome"], where
            checked += 1
        # the held-out means, mean ± s.e. over the look's seeds
        variants = {"Dr.GRPO": "dr_grpo", "ROSE": "rose", "TreePO": "treepo"}
        means = re.findall(
            r"^\s*\| (Dr\.GRPO|ROSE|TreePO) \| (\S+) ± (\S+) \| (\S+) ± (\S+) \|$", section, re.M
        )
        assert len(means) == 3, f"look {head[1]}: the held-out means table"
        for name, *figures in means:
            for (mean, se), metric in zip(
                (figures[:2], figures[2:]), ("eval/pass@1", "eval/pass@16"), strict=True
            ):
                values = [
                    check_look.value(study, variants[name], seed, {"metric": metric})
                    for seed in look["seeds"]
                ]
                assert _shown_equals(mean, float(np.mean(values))), f"look {head[1]}: {name} {metric}"
                assert _shown_equals(se, float(np.std(values, ddof=1) / math.sqrt(len(values)))), name
                checked += 1
    assert checked >= 14  # look 1's tables at least


@pytest.mark.e2e  # starts a process
def test_sign_test_rules_are_logged_and_rebuilt_from_the_raw_records_without_semrl(tmp_path):
    """Study 3's records judged with sign-test rules (two on pass@16 and one on ``collapsed``): the
    looks semrl compare logs are what scripts/check_look.py rebuilds on its own (the median of the
    non-zero differences, the order-statistic interval at the look's level, the exact binomial
    p-value); a p-value changed in the log is caught."""
    import yaml

    from semrl.cli import main

    root = Path(__file__).parents[2]
    study = root / "results" / "study3"
    for variant in ("dr_grpo", "rose", "treepo"):
        (tmp_path / variant).symlink_to(study / variant)
    body = yaml.safe_load((root / "configs" / "study" / "study3_rules.yaml").read_text())
    body["rules"] = [{**rule, "test": "sign"} for rule in body["rules"][:2]] + [
        {
            "id": "K1",
            "family": "secondary",
            "metric": "collapsed",
            "pair": ["rose", "treepo"],
            "expect": "less",
            "margin": 0.1,
            "test": "sign",
        },
    ]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(body))
    assert main(["compare", str(tmp_path), "--decide", str(rules), "--output", str(tmp_path / "out")]) == 0
    looks = [json.loads(line) for line in (tmp_path / "looks.jsonl").read_text().splitlines()]
    assert [look["look"] for look in looks] == [1, 2, 3]
    k1 = looks[-1]["rules"][2]
    assert k1["test"] == "sign" and k1["estimate"] == -1.0 and k1["p_sign"] == 1.0  # 1 seed differs: seed 108
    assert "collapsed, median" in (tmp_path / "out" / "results.md").read_text()
    script = [sys.executable, str(root / "scripts" / "check_look.py"), str(tmp_path), str(rules)]
    good = subprocess.run(script, capture_output=True, text=True)
    assert good.returncode == 0 and good.stdout.count("matches") == 9, good.stdout + good.stderr
    looks[1]["rules"][0]["p_sign"] += 1e-3
    (tmp_path / "looks.jsonl").write_text("".join(json.dumps(look) + "\n" for look in looks))
    bad = subprocess.run(script, capture_output=True, text=True)
    assert bad.returncode == 1 and "MISMATCH p_sign" in bad.stdout
