"""Seed-level statistics of semrl compare: coverage at 3, 5 and 10 seeds, power against hand and
Monte Carlo calculations, and the pairing of runs by seed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

from semrl.studies.comparison import comparison_rows, seed_differences
from semrl.studies.discovery import Run
from semrl.studies.stats import (
    compare_paired,
    min_detectable_effect,
    paired_t,
    seeds_needed,
    t_test_power,
    win_tie_loss,
)


def _study(
    rng: np.random.Generator,
    seeds: int,
    truth: float,
    seed_sd: float,
    problems: int = 32,
    identical_seeds: bool = False,
) -> dict[str, list[Run]]:
    """Two variants, ``seeds`` seeds: per problem, each variant's score is a share of 16 Bernoulli
    samples whose rate has a seed effect (seed-level variance dominant) and, for 'new', ``truth``
    added. Each run logs its final held-out mean@16."""
    groups: dict[str, list[Run]] = {"base": [], "new": []}
    first = None
    for s in range(seeds):
        if identical_seeds and first is not None:
            rates = first
        else:
            level = rng.uniform(0.3, 0.5, problems)
            rates = {
                "base": np.clip(level + rng.normal(0, seed_sd), 0, 1),
                "new": np.clip(level + truth + rng.normal(0, seed_sd), 0, 1),
            }
            first = first or rates
        for name in groups:
            # identical seeds share their samples too: the same study copied
            draws = np.random.default_rng(0 if identical_seeds else rng.integers(1 << 30))
            score = float(np.mean(draws.binomial(16, rates[name]) / 16))
            groups[name].append(Run(name, s, Path(f"{name}/seed-{s}"), [{"step": 20, "eval/mean@16": score}]))
    return groups


@pytest.mark.parametrize("seeds", [3, 5, 10])
def test_paired_t_interval_reaches_nominal_coverage(seeds):
    """1000 simulated studies per seed count, seed-level variance dominant (s.d. 0.08 per seed
    against about 0.02 from problem sampling): the 95% interval covers the true difference in
    90-100% of them. A problem-only bootstrap covers far less here."""
    rng = np.random.default_rng(seeds)
    truth, covered, trials = 0.05, 0, 1000
    for _ in range(trials):
        groups = _study(rng, seeds, truth, seed_sd=0.08)
        # the true difference of the study's expectation: truth, as the seed effects have mean 0
        d = seed_differences(groups["new"], groups["base"], "eval/mean@16")
        _, low, high = paired_t(d)
        covered += low <= truth <= high
    assert abs(covered / trials - 0.95) <= 0.05


def test_seeds_that_differ_give_a_wider_interval_than_identical_seeds():
    rng = np.random.default_rng(0)
    same = _study(rng, 5, 0.05, 0.08, identical_seeds=True)
    varied = _study(rng, 5, 0.05, 0.08)
    c_same = compare_paired(seed_differences(same["new"], same["base"], "eval/mean@16"))
    c_varied = compare_paired(seed_differences(varied["new"], varied["base"], "eval/mean@16"))
    assert c_same.high - c_same.low == pytest.approx(0.0, abs=1e-12)
    assert c_varied.high - c_varied.low > 0.05


def test_paired_t_against_a_hand_calculation():
    # d = 0.1, 0.2, 0.3: mean 0.2, s = 0.1, t_{0.975, 2} = 4.302653, half-width 4.302653 * 0.1 / sqrt(3)
    mean, low, high = paired_t([0.1, 0.2, 0.3])
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert mean == pytest.approx(0.2) and (low, high) == pytest.approx((0.2 - half, 0.2 + half), abs=1e-6)
    assert paired_t([0.4])[0] == 0.4 and math.isnan(paired_t([0.4])[1])
    with pytest.raises(ValueError, match="at least one seed"):
        paired_t([])
    assert win_tie_loss([0.1, 0.0, -0.2, 0.3, 1e-15]) == (2, 2, 1)


@pytest.mark.parametrize(("effect", "expected"), [(0.5, 34), (0.8, 15), (1.0, 10), (-0.5, 34), (0.25, 128)])
def test_seeds_needed_match_the_paired_t_test_tables(effect, expected):
    """Standardized effect d = effect / sd, two-sided alpha 0.05, power 0.8: the sample sizes of the
    paired t-test's power tables (Cohen 1988; G*Power gives the same)."""
    assert seeds_needed(effect * 0.08, 0.08) == expected
    assert seeds_needed(0.0, 0.08) is None and seeds_needed(0.1, 0.0) == 2


def test_minimal_detectable_effect_against_normal_approximation_and_monte_carlo():
    # many seeds: (z_0.975 + z_0.8) sd / sqrt(n), the textbook formula
    assert min_detectable_effect(1.0, 400) == pytest.approx((1.959964 + 0.841621) / 20, rel=5e-3)
    # few seeds: simulate the t-test at the claimed minimal detectable effect; it rejects 80% of the time
    rng = np.random.default_rng(1)
    for n, sd in ((3, 0.08), (5, 0.05), (10, 0.1)):
        mde = min_detectable_effect(sd, n)
        assert t_test_power(mde, sd, n) == pytest.approx(0.8, abs=1e-6)
        d = rng.normal(mde, sd, (40_000, n))
        t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
        from scipy import stats

        rejected = np.mean(np.abs(t) > stats.t.ppf(0.975, n - 1))
        assert rejected == pytest.approx(0.8, abs=0.01), n
    assert math.isnan(min_detectable_effect(0.1, 1)) and min_detectable_effect(0.0, 3) == 0.0
    # the MDE shrinks with seeds and seeds_needed inverts it
    assert min_detectable_effect(0.08, 3) > min_detectable_effect(0.08, 5) > min_detectable_effect(0.08, 10)
    assert seeds_needed(min_detectable_effect(0.08, 7) * 1.0001, 0.08) == 7


def test_seed_differences_pair_by_seed_and_skip_unpaired():
    def run(name: str, seed: int, value: float) -> Run:
        return Run(name, seed, Path("."), [{"step": 0, "m": 0.0}, {"step": 5, "m": value}])

    a = [run("a", 0, 0.5), run("a", 1, 0.7), run("a", 3, 0.9)]
    b = [run("b", 1, 0.6), run("b", 0, 0.2), run("b", 2, 0.1)]
    assert seed_differences(a, b, "m") == pytest.approx([0.3, 0.1])
    # over the last 2 logged steps (0 and 5): the means 0.25 - 0.1 and 0.35 - 0.3
    assert seed_differences(a, b, "m", window=2) == pytest.approx([0.15, 0.05])
    rows = comparison_rows({"a": a, "b": b}, [("a", "b")], ["m", "missing"])
    assert len(rows) == 1 and rows[0][:7] == [
        "a - b",
        "m",
        "+0.200",
        "[-1.071, +1.471]",
        "2",
        "2 / 0 / 0",
        "no",
    ]


# ------------------------------------------------------------------------------------------------
# The sign test and the median's interval (issue 62, item 2)


def test_sign_p_value_is_scipys_exact_binomial_test_of_the_differences_that_are_not_zero():
    from semrl.studies.stats import sign_p_value

    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 25))
        d = np.round(rng.standard_normal(n) + rng.normal(0, 1), int(rng.integers(0, 3)))  # some zeros
        above, below = int((d > 0).sum()), int((d < 0).sum())
        if above + below == 0:
            assert math.isnan(sign_p_value(d))
            continue
        assert math.isclose(sign_p_value(d), st.binomtest(above, above + below, 0.5).pvalue, rel_tol=1e-9)
        # bit for bit what scipy's binomial cdf gives, one call per test (the committed studies' p-values)
        assert sign_p_value(d) == min(1.0, 2 * st.binom.cdf(min(above, below), above + below, 0.5))
    assert math.isnan(sign_p_value([])) and math.isnan(sign_p_value([0.0, 0.0]))


def test_median_interval_is_the_dual_of_the_sign_test_and_covers_skewed_medians():
    """On random data with zeros, the interval at level L excludes 0 exactly when the sign test's p is
    <= L; and on a skewed, heavy-tailed shape (a collapsed seed in 12, t(3) noise) it covers the true
    median at least 1 - L of the time, where the t-interval misses the true mean more often."""
    from semrl.studies.stats import median_interval, sign_p_value

    rng = np.random.default_rng(1)
    for _ in range(2000):
        n = int(rng.integers(1, 20))
        d = np.round(rng.standard_normal(n) + rng.normal(0, 1), 1)
        level = float(rng.choice([0.001, 0.01, 0.05, 0.2]))
        median, low, high = median_interval(d, level)
        if not (d != 0).any():
            assert math.isnan(median) and math.isnan(sign_p_value(d))
            continue
        assert median == np.median(d[d != 0]) and low <= median <= high
        assert (low > 0 or high < 0) == (sign_p_value(d) <= level)
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0], 0.05)[1:] == (-math.inf, math.inf)  # 5 seeds: 0.0625
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0.05)[1:] == (1.0, 6.0)  # 2 / 64 = 0.031
    assert median_interval([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0.05)[1:] == (1.0, 6.0)  # the zero: left out
    q, far, studies, n = 1 / 12, -7.0, 5_000, 12
    x = np.where(rng.random((studies, n)) < q, far, rng.standard_t(3, (studies, n)))
    true_median = _mixture_median(q, far)
    covered = np.mean([(lambda m: m[1] <= true_median <= m[2])(median_interval(row, 0.05)) for row in x])
    assert covered >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / studies)
    true_mean = q * far
    t_low, t_high = zip(*[paired_t(row)[1:] for row in x], strict=True)
    t_covered = np.mean((np.array(t_low) <= true_mean) & (true_mean <= np.array(t_high)))
    assert t_covered < 0.93


def _mixture_median(q: float, far: float) -> float:
    """The median of: far with probability q, else t(3): q + (1 - q) T3(m) = 1/2."""
    return float(st.t.ppf((0.5 - q) / (1 - q), 3))


def test_sign_test_power_and_seeds_needed_match_a_monte_carlo_and_a_scan():
    from semrl.studies.stats import sign_p_value, sign_seeds_needed, sign_seeds_to_settle, sign_test_power

    rng = np.random.default_rng(2)
    for share, n in [(0.75, 8), (0.8, 12), (0.6, 20), (0.3, 15)]:
        above = (rng.random((20_000, n)) < share).sum(1)  # each count's p-value, computed once
        p_of = {k: sign_p_value([1.0] * k + [-1.0] * (n - k)) for k in range(n + 1)}
        simulated = np.mean([p_of[k] <= 0.05 for k in above])
        assert abs(simulated - sign_test_power(share, n)) < 4 * math.sqrt(0.25 / 20_000)
    for share in (0.8, 0.7, 0.3):
        needed = sign_seeds_needed(share)
        assert sign_test_power(share, needed) >= 0.8
        assert all(sign_test_power(share, m) < 0.8 for m in range(1, needed))
    assert sign_seeds_needed(0.5) is None
    # ties settle nothing: half the seeds tied doubles the seeds a new study needs
    assert sign_seeds_to_settle([1.0] * 8 + [-1.0] * 2) == sign_seeds_needed(0.8)
    assert sign_seeds_to_settle([1.0] * 8 + [-1.0] * 2 + [0.0] * 10) == 2 * sign_seeds_needed(0.8)
    assert sign_seeds_to_settle([0.0, 0.0]) is None


@pytest.mark.parametrize("seeds", [3, 4, 6, 12])
def test_the_pilot_sd_interval_covers_sigma_95_percent_of_the_time(seeds):
    """sd_interval on simulated pilots of normal per-seed differences: sigma inside 95 +- 1.5% of
    20,000 intervals, and missed about equally often on each side; a planned study's seeds at the
    interval's ends bracket those at the estimate."""
    from semrl.studies.stats import sd_interval, size_from_pilot

    rng = np.random.default_rng(seeds)
    sigma = 0.12
    below = above = 0
    runs = 20_000
    for _ in range(runs):
        _, low, high = sd_interval(rng.normal(0.03, sigma, seeds))
        below += high < sigma
        above += low > sigma
    assert abs((below + above) / runs - 0.05) < 0.015
    assert abs(below - above) / runs < 0.012
    sizing = size_from_pilot(list(rng.normal(0.0, sigma, seeds)), 0.044, max_seeds=16)
    assert sizing.needed_low <= sizing.needed <= sizing.needed_high
    assert sizing.within == (sizing.needed <= 16)
