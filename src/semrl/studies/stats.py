"""Seed-level statistics for comparing training variants at the seed counts people can afford (3-10).

The unit of replication is the seed: two variants run with the same seed share their data order and
held-out problems, so their per-seed difference d_s is the paired observation, and everything
below is computed from d_1..d_n alone (docs/evaluation.md, "Statistics").

- ``paired_t``: the paired t-interval over the n per-seed differences: mean(d) +- t_{n-1} s / sqrt(n).
  Its coverage is exact when the per-seed differences are normal, whatever the number of problems
  per seed; the simulations in tests/studies/test_stats.py check it at 3, 5 and 10 seeds.
- ``win_tie_loss``: how many seeds agree in sign.
- ``min_detectable_effect`` and ``seeds_needed``: the two-sided paired t-test's power from the
  noncentral t distribution, with the observed s.d. of the per-seed differences taken as the truth.
- ``sd_interval`` and ``size_from_pilot``: a pilot's s.d. with its chi-square interval, and the seeds
  a study would need at a planned effect for each end of it (issue 62's Study 4b rule).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from scipy import optimize
from scipy import stats as st

from semrl.studies.distributions import chi2_ppf, nct_cdf, nct_sf, t_ppf

ALPHA = 0.05  # two-sided: 95% intervals
POWER = 0.8
MAX_SEEDS = 100_000  # seeds_needed answers None above this


@dataclass(frozen=True)
class PairedComparison:
    """Variant minus baseline over the seeds both ran.

    Attributes:
        estimate: mean of the per-seed differences.
        low: lower end of the paired t-interval at level 1 - ALPHA (nan with one seed).
        high: its upper end.
        seeds: n, the number of paired seeds.
        wins: seeds where the difference is > 0.
        ties: seeds where it is 0 (within ``tie``).
        losses: seeds where it is < 0.
        sd: sample standard deviation (ddof 1) of the per-seed differences.
        mde: the smallest true difference the two-sided t-test at ALPHA detects with probability
            POWER at n seeds, if the s.d. is ``sd`` (nan with one seed, 0 when sd is 0).
        seeds_needed: seeds at which the observed difference would be detected with probability
            POWER, if it and ``sd`` were the truth; None when it is 0 or needs more than MAX_SEEDS.
    """

    estimate: float
    low: float
    high: float
    seeds: int
    wins: int
    ties: int
    losses: int
    sd: float
    mde: float
    seeds_needed: int | None

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def interval_text(self) -> str:
        """``[low, high]`` with signs and 3 decimals, as the tables print it; "" with one seed."""
        return "" if math.isnan(self.low) else f"[{self.low:+.3f}, {self.high:+.3f}]"

    @property
    def agreement_text(self) -> str:
        """``wins / ties / losses``."""
        return f"{self.wins} / {self.ties} / {self.losses}"


def paired_t(
    differences: Sequence[float] | np.ndarray, level: float = 1 - ALPHA
) -> tuple[float, float, float]:
    """(mean, low, high): the t-interval over the per-seed differences; (mean, nan, nan) for one."""
    d = np.asarray(differences, dtype=float)
    if d.size == 0:
        raise ValueError("a paired comparison needs at least one seed")
    mean = float(d.mean())
    if d.size < 2:
        return mean, math.nan, math.nan
    half = float(t_ppf(0.5 + level / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
    return mean, mean - half, mean + half


def win_tie_loss(differences: Sequence[float] | np.ndarray, tie: float = 1e-12) -> tuple[int, int, int]:
    """Seeds with a difference > tie, within +-tie, < -tie."""
    d = np.asarray(differences, dtype=float)
    return int((d > tie).sum()), int((np.abs(d) <= tie).sum()), int((d < -tie).sum())


def t_test_power(effect: float, sd: float, seeds: int, alpha: float = ALPHA) -> float:
    """Probability that the two-sided paired t-test at ``alpha`` rejects 0 over ``seeds`` seeds when
    the per-seed differences have mean ``effect`` and s.d. ``sd``."""
    if seeds < 2:
        return math.nan
    if sd == 0:
        return 1.0 if effect != 0 else alpha
    df, shift = seeds - 1, abs(effect) * math.sqrt(seeds) / sd
    return _rejection(t_ppf(1 - alpha / 2, df), df, shift)


def _rejection(critical: float, df: int, shift: float) -> float:
    """P(|T| > critical) for T noncentral t (df, shift); scipy's far lower tail underflows to NaN."""
    lower = nct_cdf(-critical, df, shift)
    return nct_sf(critical, df, shift) + (0.0 if math.isnan(lower) else lower)


def min_detectable_effect(sd: float, seeds: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The true difference detected with probability ``power`` at ``seeds`` seeds (s.d. ``sd``)."""
    if seeds < 2:
        return math.nan
    if sd == 0:
        return 0.0
    df = seeds - 1
    critical = t_ppf(1 - alpha / 2, df)

    def shortfall(shift: float) -> float:
        return _rejection(critical, df, shift) - power

    high = 1.0
    while shortfall(high) < 0:  # power grows with the shift; bracket it (nct is NaN far out)
        high *= 2
    shift = optimize.brentq(shortfall, 0.0, high, xtol=1e-10)
    return cast("float", shift * sd / math.sqrt(seeds))


def seeds_needed(effect: float, sd: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """The fewest seeds (>= 2) at which a true difference ``effect`` with per-seed s.d. ``sd`` is
    detected with probability ``power``; None for effect 0 or beyond MAX_SEEDS."""
    if effect == 0 or not math.isfinite(effect) or not math.isfinite(sd):
        return None
    if sd == 0:
        return 2
    low, high = 2, 2
    while t_test_power(effect, sd, high, alpha) < power:
        low, high = high, high * 2
        if high > MAX_SEEDS:
            return None
    while low < high:  # power grows with the number of seeds
        mid = (low + high) // 2
        if t_test_power(effect, sd, mid, alpha) >= power:
            high = mid
        else:
            low = mid + 1
    return high


def sd_interval(differences: Sequence[float], alpha: float = ALPHA) -> tuple[float, float, float]:
    """(s, low, high): the sample s.d. of normal per-seed differences and its two-sided 1 - alpha
    interval for sigma, s sqrt((n - 1) / chi2_{1-alpha/2, n-1}) to s sqrt((n - 1) / chi2_{alpha/2, n-1})."""
    n = len(differences)
    if n < 2:
        return math.nan, math.nan, math.nan
    s = float(np.std(differences, ddof=1))
    df = n - 1
    return (
        s,
        s * math.sqrt(df / chi2_ppf(1 - alpha / 2, df)),
        s * math.sqrt(df / chi2_ppf(alpha / 2, df)),
    )


@dataclass(frozen=True)
class PilotSizing:
    """What a pilot says about a planned study of one rule (``size_from_pilot``).

    Attributes:
        seeds: the pilot's seeds; sd, sd_low, sd_high: the s.d. of its per-seed differences and its
            95% interval; effect: the planned true difference; needed, needed_low, needed_high: the
            seeds for ``power`` at ``effect`` with the two-sided paired t-test at alpha, if sigma is
            sd, sd_low or sd_high (None: beyond MAX_SEEDS); within: needed <= max_seeds.
    """

    seeds: int
    sd: float
    sd_low: float
    sd_high: float
    effect: float
    needed: int | None
    needed_low: int | None
    needed_high: int | None
    max_seeds: int

    @property
    def within(self) -> bool:
        return self.needed is not None and self.needed <= self.max_seeds


def size_from_pilot(
    differences: Sequence[float], effect: float, max_seeds: int, alpha: float = ALPHA, power: float = POWER
) -> PilotSizing:
    """The seeds a fixed-design study needs for ``power`` at ``effect``, from a pilot's per-seed
    differences: at their s.d. and at both ends of its interval. The pilot's mean is not used (it is
    descriptive, never evidence for the planned study)."""
    sd, low, high = sd_interval(differences, alpha)
    return PilotSizing(
        len(differences),
        sd,
        low,
        high,
        effect,
        seeds_needed(effect, sd, alpha, power),
        seeds_needed(effect, low, alpha, power),
        seeds_needed(effect, high, alpha, power),
        max_seeds,
    )


@functools.lru_cache(maxsize=256)
def _fair_coin_cdf(m: int) -> np.ndarray:
    """(m + 1,): P(Bin(m, 1/2) <= k) for k = 0..m, ``st.binom.cdf``'s values computed once per m (a
    call per seed count costs about 100 us of argument checks; the design simulations make thousands)."""
    cdf = st.binom.cdf(np.arange(m + 1), m, 0.5)
    cdf.flags.writeable = False
    return cast("np.ndarray", cdf)


def sign_p_value(differences: Sequence[float]) -> float:
    """Two-sided exact sign test that a seed's difference is as likely > 0 as < 0: over the m
    non-zero differences, 2 P(Bin(m, 1/2) <= min(#{d > 0}, #{d < 0})), at most 1 (nan when every
    difference is 0). A zero says nothing about the direction and is left out, as in McNemar's test,
    which this is for a 0/1 metric. It assumes only independent seeds; for a continuous metric it
    tests a median difference of 0. Its smallest value is 2 / 2^m (0.031 at 6 seeds, 0.0625 at 5)."""
    d = np.asarray(differences, dtype=float)
    above, below = int((d > 0).sum()), int((d < 0).sum())
    if above + below == 0:
        return math.nan
    return float(min(1.0, 2 * _fair_coin_cdf(above + below)[min(above, below)]))


def median_interval(differences: Sequence[float] | np.ndarray, level: float) -> tuple[float, float, float]:
    """(median, low, high) of the m non-zero per-seed differences: the distribution-free interval
    [d_(k), d_(m+1-k)] of their order statistics, with k the largest integer such that
    2 P(Bin(m, 1/2) <= k - 1) <= ``level``. It is the dual of ``sign_p_value`` (it excludes 0
    exactly when that p-value is <= ``level``), and covers the median with probability at least
    1 - level for any continuous distribution, skewed or heavy-tailed. (-inf, +inf) when m cannot
    reach ``level`` (fewer than 6 at 0.05); all nan when every difference is 0."""
    d = np.asarray(differences, dtype=float)
    d = np.sort(d[d != 0])
    m = d.size
    if m == 0:
        return math.nan, math.nan, math.nan
    cdf = _fair_coin_cdf(m)
    k = 0
    while k <= m and 2 * cdf[k] <= level:
        k += 1
    median = float(np.median(d))
    if k == 0:
        return median, -math.inf, math.inf
    return median, float(d[k - 1]), float(d[m - k])


MAX_SIGN_SEEDS = 10_000


@functools.lru_cache(maxsize=4)
def _sign_critical(alpha: float) -> np.ndarray:
    """c[n - 1] for n = 1..MAX_SIGN_SEEDS: the largest c with 2 P(Bin(n, 1/2) <= c) <= alpha (the
    exact sign test rejects when the fewer of the signs is <= c), or -1 where no c is small enough;
    computed once per alpha."""
    n = np.arange(1, MAX_SIGN_SEEDS + 1)
    c = st.binom.ppf(alpha / 2, n, 0.5).astype(int)
    while (too_big := (c >= 0) & (2 * st.binom.cdf(c, n, 0.5) > alpha)).any():
        c[too_big] -= 1
    return cast("np.ndarray", c)


def _sign_power(share: float, n: np.ndarray, alpha: float) -> np.ndarray:
    c = _sign_critical(alpha)[n - 1]
    power = st.binom.cdf(c, n, share) + st.binom.sf(n - c - 1, n, share)
    return np.where(c >= 0, power, 0.0)


def sign_test_power(share: float, seeds: int, alpha: float = ALPHA) -> float:
    """Probability that the two-sided exact sign test at ``alpha`` (``sign_p_value``) rejects over
    ``seeds`` seeds (at most MAX_SIGN_SEEDS) when a seed's difference is > 0 with probability
    ``share``."""
    return float(_sign_power(share, np.array([seeds]), alpha)[0])


def sign_seeds_needed(share: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """The fewest seeds whose differences are not 0 at which the exact sign test detects a share
    ``share`` of them above 0 with probability ``power`` (the sign test's power saws up and down
    with n; this is the first n that reaches it); None at share 1/2 or beyond 10,000 seeds."""
    if share == 0.5 or not 0 <= share <= 1:
        return None
    for low, high in ((1, 100), (101, 1_000), (1_001, MAX_SIGN_SEEDS)):  # most shares stop early
        n = np.arange(low, high + 1)
        reached = np.flatnonzero(_sign_power(share, n, alpha) >= power)
        if reached.size:
            return int(n[reached[0]])
    return None


def sign_seeds_to_settle(differences: Sequence[float] | np.ndarray, tie: float = 1e-12) -> int | None:
    """Seeds a new study would need for the exact sign test to settle at 80% power, if the observed
    shares were the truth: ``sign_seeds_needed`` of the share above 0 among the seeds that differ,
    over the share of seeds that differ (a tie settles nothing)."""
    wins, ties, losses = win_tie_loss(differences, tie)
    if wins + losses == 0:
        return None
    needed = sign_seeds_needed(wins / (wins + losses))
    return None if needed is None else math.ceil(needed * (wins + ties + losses) / (wins + losses))


def compare_paired(differences: Sequence[float], tie: float = 1e-12, test: str = "t") -> PairedComparison:
    """Everything ``semrl compare`` reports for one metric and pair, from the per-seed differences;
    ``test="sign"``: the median of the non-zero differences, its sign-test interval and
    ``sign_seeds_to_settle``."""
    d = np.asarray(differences, dtype=float)
    if test == "sign":
        median, low, high = median_interval(d, ALPHA)
        return PairedComparison(
            median,
            low,
            high,
            int(d.size),
            *win_tie_loss(d, tie),
            sd=float(d.std(ddof=1)) if d.size > 1 else math.nan,
            mde=math.nan,
            seeds_needed=sign_seeds_to_settle(d, tie),
        )
    estimate, low, high = paired_t(d)
    sd = float(d.std(ddof=1)) if d.size > 1 else math.nan
    return PairedComparison(
        estimate,
        low,
        high,
        int(d.size),
        *win_tie_loss(d, tie),
        sd=sd,
        mde=min_detectable_effect(sd, d.size) if d.size > 1 else math.nan,
        seeds_needed=seeds_needed(estimate, sd) if d.size > 1 else None,
    )
