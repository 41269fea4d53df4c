"""Group-sequential designs, multiplicity corrections and exact sign-flip p-values for decision rules
judged at several looks (docs/evaluation.md, "Designs").

A study with K planned looks at n_1 < ... < n_K seeds tests each rule's mean per-seed difference at
every look. Repeating a 95% interval at every look inflates the chance of a false decision (three
looks: about 5% per side instead of 2.5%), so each look k gets a nominal level from a two-sided
boundary c_k on the z scale with P(|Z_j| >= c_j at some look j | no effect) = alpha, Z_j the
standardised statistic at look j (correlation sqrt(n_i / n_j)). Boundaries come from:

- ``pocock`` / ``obrien_fleming``: the classical constant designs (Pocock 1977; O'Brien & Fleming
  1979): c_k = C, or c_k = C sqrt(K / k) with equal increments (information fraction t_k otherwise);
- ``spending``: Lan & DeMets (1983) alpha-spending, O'Brien-Fleming type
  alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)) or Pocock type alpha ln(1 + (e - 1) t).

Crossing probabilities are computed by the recursive numerical integration of Armitage, McPherson &
Rowe (1969) on the score scale. With few seeds the statistic is a t with n_k - 1 degrees of freedom,
not a z: ``nominal_levels`` gives each look the two-sided level p_k at which the t-test of normal
differences crosses first at look k with the z design's probability (calibrated by simulation; the
z design's own levels, Jennison & Turnbull 2000 section 3.4, let 6% through at 3, 4 and 5 seeds), and
the look's repeated confidence interval is mean +- t_{n_k - 1, 1 - p_k / 2} s / sqrt(n_k).
tests/studies/test_sequential.py checks the boundaries against published tables and the error rates by
simulation.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import cast

import numpy as np
from scipy import optimize

from semrl.studies.distributions import norm_cdf, norm_pdf, norm_ppf, norm_sf, t_ppf, t_sf

BOUNDARIES = ("pocock", "obrien_fleming", "spending_obrien_fleming", "spending_pocock")
GRID = 801  # points of the continuation region per look
UNBOUNDED_EDGE = 12.0  # z; beyond it lies 3.6e-33 of a normal's mass, and no boundary (brentq's bracket)


# The score's density on the continuation region after a look: (grid, density, information level).
_Continuation = tuple[np.ndarray, np.ndarray, float]


def _crossing(before: _Continuation | None, c: float, level: float) -> float:
    """P(first crossing of |Z| >= c at a look of information ``level``), the looks ``before`` it
    passed without a crossing (None: this is the first look)."""
    if before is None:
        return float(2 * norm_sf(c))
    grid, density, previous = before
    edge, sd = c * math.sqrt(level), math.sqrt(level - previous)
    cross = norm_sf((edge - grid) / sd) + norm_cdf((-edge - grid) / sd)
    return float((_simpson(grid) * density) @ cross)


def _continued(before: _Continuation | None, c: float, level: float) -> _Continuation:
    """The continuation region after a look with boundary ``c`` at information ``level``; a look
    without a boundary (c = inf: it spends under 1e-15) leaves |Z| < UNBOUNDED_EDGE."""
    edge = (c if math.isfinite(c) else UNBOUNDED_EDGE) * math.sqrt(level)
    grid = np.linspace(-edge, edge, GRID)
    if before is None:
        return grid, norm_pdf(grid, scale=math.sqrt(level)), level
    previous_grid, density, previous = before
    sd = math.sqrt(level - previous)
    kernel = norm_pdf((grid[:, None] - previous_grid[None, :]) / sd) / sd
    return grid, kernel @ (_simpson(previous_grid) * density), level


def _crossing_probabilities(bounds: Sequence[float], info: Sequence[float]) -> list[float]:
    """P(first crossing of |Z| >= c_k at look k) under no effect, k = 1..K, for information levels
    ``info`` (increasing; any scale) and z boundaries ``bounds``. The score S_k = Z_k sqrt(I_k) has
    independent normal increments of variance I_k - I_{k-1}; the region after the last look is not
    needed, so K looks cost K - 1 kernels (801 x 801 normal densities, about 3 ms each)."""
    out: list[float] = []
    region: _Continuation | None = None
    for k, (c, level) in enumerate(zip(bounds, info, strict=True)):
        out.append(_crossing(region, c, level))
        if k < len(bounds) - 1:
            region = _continued(region, c, level)
    return out


def _simpson(grid: np.ndarray) -> np.ndarray:
    """Simpson weights of an odd number of equally spaced points."""
    h = grid[1] - grid[0]
    w = np.ones(len(grid))
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return cast("np.ndarray", w * h / 3)


def spent(kind: str, t: float, alpha: float) -> float:
    """Lan-DeMets cumulative two-sided alpha spent by information fraction t in (0, 1]."""
    if kind == "spending_obrien_fleming":
        return float(2 - 2 * norm_cdf(norm_ppf(1 - alpha / 2) / math.sqrt(t)))
    if kind == "spending_pocock":
        return float(alpha * math.log(1 + (math.e - 1) * t))
    raise ValueError(f"unknown spending function '{kind}'")


@functools.lru_cache(maxsize=64)
def _cached_boundaries(looks: tuple[int, ...], alpha: float, kind: str) -> tuple[float, ...]:
    return tuple(_boundaries(looks, alpha, kind))


def boundaries(
    looks: Sequence[int], alpha: float = 0.05, kind: str = "spending_obrien_fleming"
) -> list[float]:
    """Two-sided z boundaries c_1..c_K of a design with looks at ``looks`` seeds (information
    proportional to the seeds) and overall two-sided level ``alpha``."""
    return list(_cached_boundaries(tuple(int(n) for n in looks), float(alpha), kind))


def _boundaries(looks: Sequence[int], alpha: float, kind: str) -> list[float]:
    if kind not in BOUNDARIES:
        raise ValueError(f"boundary must be one of {', '.join(BOUNDARIES)}, got '{kind}'")
    if list(looks) != sorted(set(looks)) or looks[0] < 2:
        raise ValueError(f"looks must be increasing seed counts >= 2, got {list(looks)}")
    info = [float(n) for n in looks]
    fractions = [n / info[-1] for n in info]
    if kind in ("pocock", "obrien_fleming"):
        shape = [1.0] * len(info) if kind == "pocock" else [1 / math.sqrt(t) for t in fractions]

        def excess(scale: float) -> float:
            return sum(_crossing_probabilities([scale * s for s in shape], info)) - alpha

        scale = optimize.brentq(excess, 0.5, 10.0, xtol=1e-10)
        return [scale * s for s in shape]
    # each look's boundary solved in turn, from the region the looks before it leave (fixed by then)
    bounds: list[float] = []
    region: _Continuation | None = None
    for k, t in enumerate(fractions):
        target = spent(kind, t, alpha) - (spent(kind, fractions[k - 1], alpha) if k else 0.0)

        def crossing(
            c: float, k: int = k, target: float = target, before: _Continuation | None = region
        ) -> float:
            return _crossing(before, c, info[k]) - target

        bounds.append(
            optimize.brentq(crossing, 0.5, UNBOUNDED_EDGE, xtol=1e-10) if target > 1e-15 else math.inf
        )
        if k < len(fractions) - 1:
            region = _continued(region, bounds[-1], info[k])
    return bounds


def z_nominal_levels(
    looks: Sequence[int], alpha: float = 0.05, kind: str = "spending_obrien_fleming"
) -> list[float]:
    """Each look's nominal two-sided level p_k = 2 (1 - Phi(c_k)) on the z scale (known variance)."""
    return [float(2 * norm_sf(c)) for c in boundaries(looks, alpha, kind)]


def spent_per_look(
    looks: Sequence[int], alpha: float = 0.05, kind: str = "spending_obrien_fleming"
) -> list[float]:
    """The alpha each look spends: P(first crossing at look k | no effect) of the z design, summing
    to ``alpha`` (the spending function's increments, or the classical boundary's crossings)."""
    return list(_cached_spent(tuple(int(n) for n in looks), float(alpha), kind))


@functools.lru_cache(maxsize=64)
def _cached_spent(looks: tuple[int, ...], alpha: float, kind: str) -> tuple[float, ...]:
    return tuple(_crossing_probabilities(boundaries(looks, alpha, kind), [float(n) for n in looks]))


CALIBRATION_DRAWS = 400_000


CALIBRATION_CHUNK = 8192  # simulated studies drawn at a time


def _look_moments(looks: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(CALIBRATION_DRAWS, K) running sums and sums of squares of each simulated study's first n_k
    differences, at each look n_k. The studies are drawn a chunk at a time from one generator, which
    gives the numbers of one (CALIBRATION_DRAWS, n_K) draw, and each row's cumulative sums are those of
    the whole matrix, bit for bit: a study of 512 seeds needs 2 arrays of (400,000, K) instead of 3 of
    (400,000, 512) (4.9 GB) and about a third of the time. Each chunk is drawn, squared and summed
    into the same two (CALIBRATION_CHUNK, n_K) buffers, which saves about a fifth of the rest (6.1 s
    to 4.8 s at looks of 256 and 512 seeds on a 2-core Xeon: fresh memory for every chunk cost the
    kernel's page faults)."""
    rng, columns = np.random.default_rng(20261125), np.asarray(looks) - 1
    sums = np.empty((CALIBRATION_DRAWS, len(looks)))
    squares = np.empty_like(sums)
    draws = np.empty((CALIBRATION_CHUNK, looks[-1]))
    running = np.empty_like(draws)
    for start in range(0, CALIBRATION_DRAWS, CALIBRATION_CHUNK):
        rows = slice(start, min(start + CALIBRATION_CHUNK, CALIBRATION_DRAWS))
        d, cumulative = draws[: rows.stop - rows.start], running[: rows.stop - rows.start]
        rng.standard_normal(out=d)
        sums[rows] = np.cumsum(d, axis=1, out=cumulative)[:, columns]
        np.multiply(d, d, out=d)
        squares[rows] = np.cumsum(d, axis=1, out=cumulative)[:, columns]
    return sums, squares


@functools.lru_cache(maxsize=4)
def _calibration_p_values(looks: tuple[int, ...]) -> np.ndarray:
    """(CALIBRATION_DRAWS, K) read-only: each simulated study's two-sided t-test p-value at each look.
    They depend on the looks alone, so a design's calibrations for each share of alpha (Holm's
    alpha / m ... alpha, one per family) and each boundary draw the studies once: at looks of 256
    and 512 seeds, four shares took 19.6-22.4 s and take 4.9-5.0 s on a 2-core Xeon."""
    sums, squares = _look_moments(looks)
    p_values = np.empty_like(sums)
    for k, n in enumerate(looks):
        mean = sums[:, k] / n
        sd = np.sqrt(np.maximum(squares[:, k] - n * mean**2, 0.0) / (n - 1))
        p_values[:, k] = 2 * t_sf(np.abs(mean) / (sd / math.sqrt(n)), n - 1)
    p_values.flags.writeable = False
    return p_values


@functools.lru_cache(maxsize=64)
def nominal_levels(
    looks: tuple[int, ...], alpha: float = 0.05, kind: str = "spending_obrien_fleming"
) -> list[float]:
    """Each look's nominal two-sided level for the t-test of the per-seed differences: the levels at
    which normal differences of unknown variance first cross at look k with the z design's
    probability (its spending increment). With few seeds the z levels used as t levels let more
    than alpha through (about 6% at looks of 3, 4 and 5 seeds); the t statistic is pivotal under
    normality, so a simulation of 400,000 studies (fixed seed) calibrates the levels to within
    Monte Carlo error (s.e. about 0.0003 on alpha = 0.05)."""
    looks = tuple(int(n) for n in looks)
    increments = spent_per_look(looks, alpha, kind)
    p_values = _calibration_p_values(looks)
    alive = np.ones(CALIBRATION_DRAWS, dtype=bool)
    levels = []
    for k, target in enumerate(increments):
        p = p_values[:, k]
        candidates = np.sort(p[alive])
        m = int(round(target * CALIBRATION_DRAWS))
        level = (
            float(candidates[m - 1] + candidates[m]) / 2
            if 0 < m < len(candidates)
            else (0.0 if m == 0 else 1.0)
        )
        levels.append(level)
        alive &= ~(p < level)
    return levels


def repeated_interval(differences: Sequence[float], level: float) -> tuple[float, float, float]:
    """(mean, low, high): the t-interval of the per-seed differences at two-sided nominal ``level``
    (a look's repeated confidence interval)."""
    d = np.asarray(differences, dtype=float)
    mean = float(d.mean())
    if d.size < 2:
        return mean, math.nan, math.nan
    half = float(t_ppf(1 - level / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
    return mean, mean - half, mean + half


def t_p_value(differences: Sequence[float]) -> float:
    """Two-sided one-sample t-test p-value of mean 0 (nan with fewer than 2 seeds; 0 or 1 when the
    differences are all equal)."""
    d = np.asarray(differences, dtype=float)
    if d.size < 2:
        return math.nan
    sd = d.std(ddof=1)
    if sd == 0:
        return 0.0 if d.mean() != 0 else 1.0
    return float(2 * t_sf(abs(d.mean()) / (sd / math.sqrt(d.size)), d.size - 1))


MAX_SIGN_FLIP_SEEDS = 12


@functools.lru_cache(maxsize=MAX_SIGN_FLIP_SEEDS)
def _sign_patterns(n: int) -> np.ndarray:
    """(2^n, n) every pattern of n signs, built once per n (read-only)."""
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    signs.flags.writeable = False
    return signs


def sign_flip_p_value(differences: Sequence[float]) -> float:
    """Exact two-sided sign-flip (permutation) p-value of mean 0 over all 2^n sign patterns, for
    n <= 12: valid for any distribution symmetric about 0. Its smallest value is 2 / 2^n (0.0625
    at 5 seeds), so below 6 seeds it cannot reach 0.05."""
    d = np.asarray(differences, dtype=float)
    if not 1 <= d.size <= MAX_SIGN_FLIP_SEEDS:
        raise ValueError(f"the exact sign-flip p-value takes 1 to {MAX_SIGN_FLIP_SEEDS} seeds, got {d.size}")
    signs = _sign_patterns(d.size)
    observed = abs(d.sum())
    return float(np.mean(np.abs(signs @ d) >= observed - 1e-12 * max(1.0, observed)))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm (1979) step-down adjusted p-values (family-wise error)."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    m = len(p)
    adjusted = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return out.tolist()


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini & Hochberg (1995) step-up adjusted p-values (false discovery rate)."""
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum.accumulate(scaled[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return out.tolist()


def bonferroni(p_values: Sequence[float]) -> list[float]:
    """Bonferroni adjusted p-values: m p, at most 1."""
    return [min(1.0, float(x) * len(p_values)) for x in p_values]


CORRECTIONS = {
    "holm": holm,
    "bh": benjamini_hochberg,
    "bh_spent": benjamini_hochberg,
    "bonferroni": bonferroni,
    "none": lambda p: list(map(float, p)),
}
# What each correction holds at alpha for its family (docs/evaluation.md, "Designs"). Over several
# looks, BH at each look's nominal level lets the false discovery rate reach 0.0525 with 6 rules
# under no effect (tests/studies/test_error_rates.py); BH at the alpha each look spends holds it over the
# looks: the false share of all decisions is at most the sum of the looks' false shares.
CONTROLS = {
    "holm": "family-wise error",
    "bonferroni": "family-wise error",
    "bh": "false discovery rate at each look",
    "bh_spent": "false discovery rate over the looks",
    "none": "each rule's error alone",
}


# ------------------------------------------------------------------------------------------------
# Anytime-valid: the group-invariant t-test e-value and its confidence sequence


def t_e_value(
    differences: Sequence[float] | np.ndarray, prior_scale: float = 1.0, mean0: float = 0.0
) -> float:
    """The e-value of the one-sample t-test of mean ``mean0`` with unknown variance: the Bayes factor
    of the scale-invariant reduction of the data, with the standardised effect (mean - mean0) / sd
    ~ N(0, prior_scale) under the alternative and the right-Haar prior 1/sd on the scale (Lai 1976;
    Pérez-Ortiz, Lardy, de Heide & Grünwald 2024). In closed form, with t the t-statistic and
    nu = n - 1:

        E_n = (1 + n g)^(-1/2) [(1 + t^2 / nu) / (1 + t^2 / (nu (1 + n g)))]^((nu + 1) / 2)

    Under the null it is a test martingale in n, so P(E_n >= 1 / alpha for some n) <= alpha (Ville's
    inequality): the seeds can be watched one at a time and the study stopped whenever it crosses.
    1 below 2 seeds."""
    d = np.asarray(differences, dtype=float) - mean0
    n = d.size
    if n < 2:
        return 1.0
    sd = float(d.std(ddof=1))
    mean = float(d.mean())
    if sd == 0:
        return math.inf if mean != 0 else 1.0
    nu, t2 = n - 1, (mean / (sd / math.sqrt(n))) ** 2
    g = prior_scale
    log_e = -0.5 * math.log1p(n * g) + (nu + 1) / 2 * (
        math.log1p(t2 / nu) - math.log1p(t2 / (nu * (1 + n * g)))
    )
    return math.exp(min(log_e, 700.0))


def confidence_sequence(
    differences: Sequence[float], alpha: float, prior_scale: float = 1.0
) -> tuple[float, float, float]:
    """(mean, low, high): the means ``m`` the data do not reject, ``t_e_value(d, mean0=m) < 1 / alpha``;
    it covers the true mean at every number of seeds at once with probability >= 1 - alpha (nan
    bounds below 2 seeds)."""
    d = np.asarray(differences, dtype=float)
    mean = float(d.mean()) if d.size else math.nan
    if d.size < 2:
        return mean, math.nan, math.nan
    sd = float(d.std(ddof=1))
    if sd == 0:
        return mean, mean, mean
    target = math.log(1 / alpha)
    n = d.size
    if (n - 1) / 2 * math.log1p(n * prior_scale) <= target:  # sup over t of E_n: nothing is rejected yet
        return mean, -math.inf, math.inf

    def excess(m: float) -> float:
        return math.log(max(t_e_value(d, prior_scale, m), 1e-300)) - target

    bounds = []
    for sign in (-1.0, 1.0):
        step = sd
        while excess(mean + sign * step) < 0:
            step *= 2
        bounds.append(optimize.brentq(lambda u, s=sign: excess(mean + s * u), 0.0, step, xtol=1e-12 * sd))
    return mean, mean - bounds[0], mean + bounds[1]
