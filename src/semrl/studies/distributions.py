"""The t, noncentral t, chi-square, normal and beta-binomial functions the studies call per seed, per
rule and per simulated study, through ``scipy.special``.

``scipy.stats``' distribution objects check and broadcast their arguments on every call: about
100-150 us for a scalar, 50-100x the function itself, which made these calls most of the time of
``semrl compare``'s seed counts and of the design simulations. Each function here is what
``scipy.stats`` computes after those checks, so it returns the same value bit for bit
(tests/studies/test_distributions.py compares them on random arguments).
"""

from __future__ import annotations

import numpy as np
from scipy import special
from scipy import stats as st

_SQRT_2PI = np.sqrt(2 * np.pi)


def t_ppf(q: float, df: float) -> float:
    """Quantile ``q`` of Student's t with ``df`` degrees of freedom (``st.t.ppf(q, df)``), q in (0, 1)."""
    return float(special.stdtrit(df, q))


def t_sf(x: np.ndarray | float, df: float) -> np.ndarray:
    """P(T > x) for Student's t (``st.t.sf(x, df)``); elementwise over ``x``."""
    return special.stdtr(df, -np.asarray(x))  # type: ignore[no-any-return]


def nct_cdf(x: float, df: float, shift: float) -> float:
    """P(T <= x) for the noncentral t with noncentrality ``shift`` (``st.nct.cdf``); NaN where
    scipy's far lower tail underflows, as there."""
    return float(special.nctdtr(df, shift, x))


def nct_sf(x: float, df: float, shift: float) -> float:
    """P(T > x) for the noncentral t (``st.nct.sf``). For x >= 0 (a critical value) it is
    P(-T < -x), -T being noncentral t with noncentrality -shift; below 0 scipy's own upper tail
    differs from that in where it gives NaN, so it is asked."""
    if x < 0:
        return float(st.nct.sf(x, df, shift))
    return float(np.clip(special.nctdtr(df, -shift, -x), 0.0, 1.0))


def chi2_ppf(q: float, df: float) -> float:
    """Quantile ``q`` of the chi-square with ``df`` degrees of freedom (``st.chi2.ppf``), q in (0, 1)."""
    return float(2 * special.gammaincinv(df / 2, q))


def norm_pdf(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """The normal density of mean 0 and s.d. ``scale`` at each of ``x`` (``st.norm.pdf``)."""
    z = np.asarray(x, dtype=float) / scale
    return np.exp(-(z**2) / 2.0) / _SQRT_2PI / scale  # type: ignore[no-any-return]


def norm_cdf(x: np.ndarray | float) -> np.ndarray:
    """P(Z <= x) for the standard normal (``st.norm.cdf``); elementwise."""
    return special.ndtr(x)  # type: ignore[no-any-return]


def norm_sf(x: np.ndarray | float) -> np.ndarray:
    """P(Z > x) for the standard normal (``st.norm.sf``); elementwise."""
    return special.ndtr(-np.asarray(x))  # type: ignore[no-any-return]


def norm_ppf(q: float) -> float:
    """Quantile ``q`` of the standard normal (``st.norm.ppf``), q in (0, 1)."""
    return float(special.ndtri(q))


def betabinom_logpmf(k: np.ndarray, n: int, a: float, b: float) -> np.ndarray:
    """log P(K = k) for the beta-binomial of n trials and Beta(a, b) (``st.betabinom.logpmf``), for
    integers 0 <= k <= n; elementwise over ``k``."""
    k = np.asarray(k, dtype=float)
    log_choose = -np.log(n + 1) - special.betaln(n - k + 1, k + 1)
    return log_choose + special.betaln(k + a, n - k + b) - special.betaln(a, b)  # type: ignore[no-any-return]
