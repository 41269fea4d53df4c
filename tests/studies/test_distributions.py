"""semrl.studies.distributions gives scipy.stats' values bit for bit, on random arguments over the
ranges the studies use (seeds 2-300, shifts 0-15, tails included)."""

import numpy as np
from scipy import stats as st

from semrl.studies import distributions as dist


def _same(a, b) -> bool:  # noqa: ANN001
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def test_each_function_equals_scipy_stats_bit_for_bit():
    rng = np.random.default_rng(0)
    for _ in range(1000):
        df = int(rng.integers(1, 300))
        q = float(rng.uniform(1e-6, 1 - 1e-6)) if rng.uniform() < 0.8 else float(rng.choice([0.025, 0.975]))
        x = float(rng.normal(0, 4))
        shift = float(rng.uniform(0, 15))
        scale = float(rng.uniform(0.05, 5))
        xs = rng.normal(0, 3, int(rng.integers(1, 9)))
        assert _same(dist.t_ppf(q, df), st.t.ppf(q, df)), (q, df)
        assert _same(dist.t_sf(x, df), st.t.sf(x, df)) and _same(dist.t_sf(xs, df), st.t.sf(xs, df))
        assert _same(dist.nct_cdf(x, df, shift), st.nct.cdf(x, df, shift)), (x, df, shift)
        assert _same(dist.nct_sf(x, df, shift), st.nct.sf(x, df, shift)), (x, df, shift)
        assert _same(dist.chi2_ppf(q, df), st.chi2.ppf(q, df)), (q, df)
        assert _same(dist.norm_pdf(xs, scale), st.norm.pdf(xs, scale=scale))
        assert _same(dist.norm_pdf(xs), st.norm.pdf(xs))
        assert _same(dist.norm_cdf(xs), st.norm.cdf(xs)) and _same(dist.norm_sf(xs), st.norm.sf(xs))
        assert _same(dist.norm_sf(x), st.norm.sf(x)) and _same(dist.norm_ppf(q), st.norm.ppf(q))
        n, a, b = (
            int(rng.integers(1, 65)),
            float(np.exp(rng.uniform(-8, 8))),
            float(np.exp(rng.uniform(-8, 8))),
        )
        ks = rng.integers(0, n + 1, int(rng.integers(1, 70)))
        assert _same(dist.betabinom_logpmf(ks, n, a, b), st.betabinom.logpmf(ks, n, a, b)), (n, a, b)


def test_the_noncentral_tails_are_the_tails_and_not_each_other():
    """nct_sf is the upper tail: with a large shift it is near 1 where the cdf is near 0."""
    assert dist.nct_sf(0.0, 10, 8.0) > 0.999 and dist.nct_cdf(0.0, 10, 8.0) < 1e-3
    assert abs(dist.nct_sf(1.3, 7, 0.0) - st.t.sf(1.3, 7)) < 1e-12
