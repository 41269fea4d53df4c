"""Exploration at equal cost (issue 62, item 4): the equal-cost reference against brute force over
every subset of the independent samples and a simulated randomised-rounding sampler, and the
per-problem differences by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from semrl.studies.explore import (
    EQUAL_COST_METRICS,
    IndependentSamples,
    Leaves,
    paired_differences,
    per_token,
)


def _random_independent(rng: np.random.Generator, problem: str = "p", n: int | None = None) -> IndependentSamples:
    n = n or int(rng.integers(1, 9))
    clusters = [None if rng.random() < 0.2 else int(rng.integers(0, 4)) for _ in range(n)]
    right = int(rng.integers(0, 4))  # the gold's class
    return IndependentSamples(problem, tuple(int(x) for x in rng.integers(1, 40, n)),
                              tuple(c == right for c in clusters), tuple(clusters))


def _brute_force(samples: IndependentSamples, metric: str, k: int) -> float:
    """The mean of ``metric`` over every k-subset of the samples, counted by hand."""
    values = []
    for subset in itertools.combinations(range(samples.n), k):
        leaves = Leaves("p", 0, tuple(samples.correct[i] for i in subset), tuple(samples.clusters[i] for i in subset))
        values.append(leaves.value(metric))
    return float(np.mean(values))


@pytest.mark.parametrize("seed", range(40))
def test_independent_sampling_at_k_is_the_mean_over_every_subset(seed):
    rng = np.random.default_rng(seed)
    samples = _random_independent(rng)
    for metric in EQUAL_COST_METRICS:
        for k in range(samples.n + 1):
            assert math.isclose(samples.at_k(metric, k), _brute_force(samples, metric, k), abs_tol=1e-12)


def test_leaves_count_by_hand():
    leaves = Leaves("p", 100, (False, True, True, False, False), (3, 1, 1, None, 2))
    assert leaves.value("solved") == 1.0
    assert leaves.value("distinct_answers") == 3.0  # classes 3, 1, 2; the unanswered leaf is none
    assert leaves.value("distinct_correct") == 1.0
    assert Leaves("p", 10, (False,), (None,)).value("solved") == 0.0
    with pytest.raises(ValueError, match="unknown metric"):
        leaves.value("pass@2")
    with pytest.raises(ValueError, match="a correct leaf without an answer class"):
        Leaves("p", 10, (True,), (None,))


@pytest.mark.parametrize("seed", range(20))
def test_at_cost_interpolates_between_whole_sample_counts_and_a_randomised_sampler_spends_that_cost(seed):
    """By hand: the linear interpolation at k* = tokens / mean length. Simulated: independent sampling
    that draws floor(k*) or floor(k*) + 1 samples without replacement, mixed by the fraction, spends
    ``tokens`` on average and reaches ``at_cost`` on average."""
    rng = np.random.default_rng(100 + seed)
    samples = _random_independent(rng, n=int(rng.integers(2, 9)))
    tokens = float(rng.uniform(0, samples.n * samples.mean_length))
    k_star = tokens / samples.mean_length
    whole, fraction = math.floor(k_star), k_star - math.floor(k_star)
    draws = 40_000
    ks = whole + (rng.random(draws) < fraction)
    spent, found = np.zeros(draws), {m: np.zeros(draws) for m in EQUAL_COST_METRICS}
    lengths = np.array(samples.lengths)
    for i, k in enumerate(ks):
        chosen = rng.permutation(samples.n)[:k]
        spent[i] = lengths[chosen].sum()
        leaves = Leaves("p", 0, tuple(samples.correct[j] for j in chosen), tuple(samples.clusters[j] for j in chosen))
        for m in EQUAL_COST_METRICS:
            found[m][i] = leaves.value(m)
    assert abs(spent.mean() - tokens) < 4 * spent.std() / math.sqrt(draws) + 1e-9
    for m in EQUAL_COST_METRICS:
        hand = (1 - fraction) * _brute_force(samples, m, whole) + (
            fraction * _brute_force(samples, m, whole + 1) if fraction else 0.0)
        assert math.isclose(samples.at_cost(m, tokens), hand, abs_tol=1e-12)
        assert abs(found[m].mean() - hand) < 4 * found[m].std() / math.sqrt(draws) + 1e-9


def test_at_cost_refuses_a_cost_beyond_the_samples_drawn():
    samples = IndependentSamples("q7", (10, 10, 10, 10), (True, False, False, False), (0, 1, 1, None))
    assert samples.at_cost("solved", 40) == 1.0  # all four: certain to include the correct one
    with pytest.raises(ValueError, match=r"problem q7: equal cost needs 4.10 independent samples, but only 4"):
        samples.at_cost("solved", 41)


def test_paired_differences_average_each_problems_rollouts_at_their_own_cost():
    independent = {
        "a": IndependentSamples("a", (10,) * 4, (True, False, False, False), (0, 1, 2, 1)),
        "b": IndependentSamples("b", (20,) * 4, (False,) * 4, (0, 0, 1, None)),
    }
    trees = [
        Leaves("a", 15, (False, True), (1, 0)),  # k* 1.5: 1 - (0.5 * 3/4 + 0.5 * 1/2) = 0.375
        Leaves("a", 20, (False, False), (1, 1)),  # k* 2: 1 - 1/2 = 0.5
        Leaves("b", 40, (False, False, False), (0, 0, 0)),  # k* 2: never solved
    ]
    d = paired_differences(trees, independent, "solved")
    assert d == pytest.approx({"a": ((1 - 0.375) + (0 - 0.5)) / 2, "b": 0.0})
    # distinct answers of b at k* 2: classes of sizes 2 and 1 among 4: (1 - 1/6) + (1 - 1/2)
    assert paired_differences(trees[2:], independent, "distinct_answers") == pytest.approx({"b": 1 - (5 / 6 + 1 / 2)})
    with pytest.raises(ValueError, match="problem z has no independent samples"):
        paired_differences([Leaves("z", 5, (True,), (0,))], independent, "solved")
    assert per_token(trees, "solved") == pytest.approx(1000 * 1 / 75)
