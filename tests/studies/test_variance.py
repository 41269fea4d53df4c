"""The variance decomposition of per-seed differences (semrl.studies.variance): metrics against
summarize_records, bootstrap variances and the training share against simulated studies whose
variances are known, and the design search against brute force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from semrl.evaluation import summarize_records
from semrl.studies.variance import (
    Decomposition,
    Samples,
    cheapest_designs,
    decompose,
    draw_variances,
    half_width,
    metric_value,
    var_per_seed,
    variance_section,
)

METRICS = ["pass@1", "pass@3", "pass@8", "mean@8", "distinct_answers", "response_length/correct"]


def _records(rng: np.random.Generator, problems: int, n: int) -> list[dict]:
    out = []
    for i in range(problems):
        p = rng.choice([0.0, rng.uniform(), 1.0], p=[0.3, 0.6, 0.1])
        samples = []
        for _ in range(n):
            answered = rng.uniform() < 0.8
            correct = bool(answered and rng.uniform() < p)
            samples.append(
                {
                    "response": "",
                    "answer": "x" if answered else None,
                    "correct": correct,
                    "length": int(rng.integers(1, 60)),
                    "truncated": False,
                    "timed_out": False,
                    "cluster": 0 if correct else int(rng.integers(1, 4)),
                }
            )
        out.append({"id": str(i), "gold": "1", "level": None, "subject": None, "samples": samples})
    return out


@pytest.mark.parametrize("case", range(30))
def test_metrics_equal_summarize_records(case):
    rng = np.random.default_rng(case)
    records = _records(rng, int(rng.integers(1, 20)), 8)
    reference = summarize_records(records)
    samples = Samples.from_records(records)
    for metric in METRICS:
        assert metric_value(metric, samples) == pytest.approx(reference[metric], abs=1e-12), metric
    with pytest.raises(ValueError, match="pass@9"):
        metric_value("pass@9", samples)
    with pytest.raises(ValueError, match="maj@8"):
        metric_value("maj@8", samples)


def _evaluation(rng, logits: np.ndarray, n: int) -> Samples:
    """n samples of each problem whose success probability is sigmoid(logit)."""
    p = 1 / (1 + np.exp(-logits))
    correct = rng.uniform(size=(len(p), n)) < p[:, None]
    lengths = np.where(correct, 20, 40) + rng.integers(0, 10, size=correct.shape)
    clusters = np.where(correct, 0, rng.integers(1, 5, size=correct.shape))
    return Samples(correct, lengths.astype(float), clusters)


def _seed(rng, problems: int, n: int, effect: float, train_sd: float = 0.0) -> tuple[Samples, Samples]:
    """One seed's paired evaluations: problems drawn from a population of difficulties, variant A's
    log-odds shifted by ``effect`` plus this seed's training luck."""
    base = rng.normal(-1.0, 1.5, problems)
    shift = effect + rng.normal(0.0, train_sd)
    return _evaluation(rng, base + shift, n), _evaluation(rng, base, n)


@pytest.mark.parametrize(
    "metric", ["pass@1", "pass@4", "pass@8", "distinct_answers", "response_length/correct"]
)
def test_bootstrap_variances_match_repeated_evaluations(metric):
    """The paired bootstrap over problems estimates the variance of D over fresh problem and sample
    draws; the bootstrap of samples estimates it over fresh samples of the same problems."""
    rng = np.random.default_rng(1)
    problems, n = 64, 8
    fresh = [
        metric_value(metric, a) - metric_value(metric, b)
        for a, b in (_seed(rng, problems, n, 0.5) for _ in range(600))
    ]
    true_draw = np.var(fresh, ddof=1)
    fixed = rng.normal(-1.0, 1.5, problems)
    resampled = [
        metric_value(metric, _evaluation(rng, fixed + 0.5, n))
        - metric_value(metric, _evaluation(rng, fixed, n))
        for _ in range(600)
    ]
    true_samples = np.var(resampled, ddof=1)
    estimates = [draw_variances(metric, *_seed(rng, problems, n, 0.5), 150, rng) for _ in range(24)]
    draw, samples = np.mean(estimates, axis=0)
    assert draw == pytest.approx(true_draw, rel=0.2)
    # problems differ in difficulty around the fixed ones: the samples' part of one set of problems
    fixed_estimates = [
        draw_variances(metric, _evaluation(rng, fixed + 0.5, n), _evaluation(rng, fixed, n), 150, rng)[1]
        for _ in range(24)
    ]
    if metric == "distinct_answers":  # the jackknife overstates a count's variance, never understates it
        assert true_samples < np.mean(fixed_estimates) < 2 * true_samples
    else:
        assert np.mean(fixed_estimates) == pytest.approx(true_samples, rel=0.25)
        assert samples < 1.2 * draw  # the samples' part is part of the draw's


def test_the_pass_at_k_bootstrap_draws_what_metric_value_gives_bit_for_bit():
    """``draw_variances`` draws each problem's pass@k again; drawing the problems' samples again
    through ``metric_value``, as every other metric does, gives the same numbers to the bit."""
    for seed in range(100):
        rng = np.random.default_rng(seed)
        problems, n = int(rng.integers(1, 80)), int(rng.integers(1, 17))
        metric, reps = f"pass@{rng.integers(1, n + 1)}", int(rng.integers(2, 40))
        a, b = _seed(rng, problems, n, float(rng.normal()))
        draws = np.random.default_rng(seed)
        expected = []
        for _ in range(reps):
            idx = draws.integers(0, problems, size=problems)
            expected.append(metric_value(metric, a.take(idx)) - metric_value(metric, b.take(idx)))
        draw, _ = draw_variances(metric, a, b, reps, np.random.default_rng(seed))
        assert draw == float(np.var(expected, ddof=1)), (seed, metric)


@pytest.mark.parametrize("population", [(1.0, 1.0), (0.3, 3.0), (2.0, 0.5)])
@pytest.mark.parametrize("n", [2, 4, 16])
def test_pass_at_k_sampling_variance_against_simulation(n, population):
    """Over problems whose p is drawn from a population, the estimated variances average to the
    variance of the estimate over fresh samples, for every k <= n (unbiased for 2k <= n, empirical
    Bayes above)."""
    from scipy import stats

    from semrl.evaluation import pass_at_k
    from semrl.studies.variance import pass_at_k_sampling_variance

    rng = np.random.default_rng(n)
    ps = rng.beta(*population, size=4000)
    for k in sorted({1, max(1, n // 2), n}):
        est = np.array([pass_at_k(n, j, k) for j in range(n + 1)])
        pmf = stats.binom.pmf(np.arange(n + 1)[None, :], n, ps[:, None])
        true = np.mean(pmf @ est**2 - (pmf @ est) ** 2)  # each problem's exact variance, averaged
        estimated = pass_at_k_sampling_variance(rng.binomial(n, ps), n, k).mean()
        assert estimated == pytest.approx(true, rel=0.12), (n, k)


def test_the_training_share_is_recovered_on_average():
    """Studies of 5 seeds with a known training variance about equal to the draw's: var_train_raw is
    unbiased for it (within 3 Monte Carlo standard errors, under a third of the draw's variance) and
    the draw's share falls as the training variance grows."""
    rng = np.random.default_rng(2)
    problems, n, train_sd = 48, 8, 0.2
    # the training variance on the pass@1 scale: the population's mean success over training luck
    population = rng.normal(-1.0, 1.5, 4000)
    shifts = 0.3 + rng.normal(0.0, train_sd, 2000)
    true_train = np.var([(1 / (1 + np.exp(-(population + s)))).mean() for s in shifts], ddof=1)
    studies = [
        decompose(
            "pass@1", ("a", "b"), [_seed(rng, problems, n, 0.3, train_sd) for _ in range(5)], reps=40, seed=k
        )
        for k in range(200)
    ]
    raw = np.array([d.var_train_raw for d in studies])
    assert abs(raw.mean() - true_train) < 3 * raw.std(ddof=1) / np.sqrt(len(raw))
    assert 3 * raw.std(ddof=1) / np.sqrt(len(raw)) < 0.35 * np.mean([d.var_draw for d in studies])
    quiet = [
        decompose(
            "pass@1", ("a", "b"), [_seed(rng, problems, n, 0.3, 0.0) for _ in range(5)], reps=40, seed=k
        )
        for k in range(30)
    ]
    assert np.median([d.draw_share for d in quiet]) > 0.6 > np.median([d.draw_share for d in studies])
    assert all(d.var_total_ci[0] < d.var_total < d.var_total_ci[1] for d in studies)


def test_designs_are_the_cheapest_that_reach_the_target():
    d = Decomposition(
        "pass@16", ("rose", "dr_grpo"), (0.0, 0.1), 128, 16, 0.0015, (0.0005, 0.012), 0.0015, 0.0003, 0.0002
    )
    target = 0.03
    designs = cheapest_designs(d, target, seed_cost_s=1000.0, sample_cost_s=0.1)
    assert [x.cost_s for x in designs] == sorted(x.cost_s for x in designs)
    for x in designs:
        v = var_per_seed(d, x.problems, x.samples)
        assert half_width(v, x.seeds) <= target < half_width(v, x.seeds - 1) if x.seeds > 2 else True
        assert x.cost_s == pytest.approx(x.seeds * (1000.0 + x.problems * x.samples * 0.1))
    # brute force over the same grid
    best = min(
        (s * (1000.0 + p * n * 0.1), p, n, s)
        for p in (32, 64, 128, 256, 512)
        for n in (16, 32)
        for s in range(2, 41)
        if half_width(var_per_seed(d, p, n), s) <= target
    )
    assert (designs[0].problems, designs[0].samples, designs[0].seeds) == best[1:]
    # more problems cut the draw's part only: at 4x the problems, the draw's variance is a quarter
    assert var_per_seed(d, 512, 16) == pytest.approx(0.0002 + 0.0015 / 4)


def test_compare_variance_reads_the_study_records():
    study = Path(__file__).parents[2] / "results" / "study_sparse"
    from semrl.studies.discovery import find_runs

    groups = find_runs([study], seeds=[0, 1, 2])
    text = variance_section(groups, [("rose", "dr_grpo")], metrics=("pass@16",), reps=50)
    (row,) = [line for line in text.splitlines() if line.startswith("| rose - dr_grpo")]
    assert "| pass@16 | 3 | 128 x 16 |" in row


def _jackknife_reference(metric: str, records: list[dict]) -> float:
    """The stratified delete-one jackknife written out: for each problem i and sample j, the metric
    recomputed from scratch on the records with only that sample removed; the variance is the sum
    over problems of (n - 1) / n times the squared deviations of problem i's n values from their
    mean (Efron & Stein 1981)."""

    def value(rows: list[list[dict]]) -> float:
        if metric == "distinct_answers":
            return sum(len({s["cluster"] for s in row if s["answer"] is not None}) for row in rows) / len(
                rows
            )
        lengths = [s["length"] for row in rows for s in row if s["correct"]]
        return sum(lengths) / len(lengths) if lengths else 0.0

    rows = [r["samples"] for r in records]
    total = 0.0
    for i, row in enumerate(rows):
        n = len(row)
        values = [value([*rows[:i], row[:j] + row[j + 1 :], *rows[i + 1 :]]) for j in range(n)]
        mean = sum(values) / n
        total += (n - 1) / n * sum((v - mean) ** 2 for v in values)
    return total


@pytest.mark.parametrize("case", range(12))
@pytest.mark.parametrize("metric", ["distinct_answers", "response_length/correct"])
def test_the_jackknife_variance_equals_its_definition(case, metric):
    """samples_variance of the metrics without a closed form against the jackknife recomputed by
    brute force on random records (unequal classes, unanswered samples, problems with no correct
    sample): the (n - 1) / n factor and every leave-one-out value are pinned."""
    from semrl.studies.variance import samples_variance

    rng = np.random.default_rng(100 + case)
    records = _records(rng, problems=int(rng.integers(2, 9)), n=int(rng.integers(2, 7)))
    expected = _jackknife_reference(metric, records)
    assert samples_variance(metric, Samples.from_records(records)) == pytest.approx(
        expected, rel=1e-9, abs=1e-12
    )
