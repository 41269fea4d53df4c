"""Unbiased pass@k against a direct combinatorial computation."""

from math import comb

import pytest

from semrl.evaluation import pass_at_k, summarize_correctness


@pytest.mark.parametrize("n", [1, 2, 5, 8, 16])
def test_pass_at_k_matches_combinatorics(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            direct = 1.0 - comb(n - c, k) / comb(n, k)  # comb(a, k) = 0 when a < k
            assert pass_at_k(n, c, k) == pytest.approx(direct, abs=1e-12)


def test_pass_at_k_edge_cases():
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 1, 8) == 1.0  # n - c < k
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_summarize_correctness():
    out = summarize_correctness([[True, False, False, False], [True, True, True, True]])
    assert out["mean@4"] == pytest.approx((0.25 + 1.0) / 2)
    assert out["pass@1"] == pytest.approx(out["mean@4"])
    assert out["pass@4"] == 1.0
    assert out["pass@2"] == pytest.approx((0.5 + 1.0) / 2)
    with pytest.raises(ValueError, match="same number"):
        summarize_correctness([[True], [True, False]])
