"""Where the variance of a per-seed difference comes from, and the cheapest evaluation for a target
interval (docs/results.md, "Where the variance is").

A study's claim is judged on D_s = M_A(s) - M_B(s), the difference of two variants' final metric on
seed s. D_s varies across seeds for two reasons: how each seed's training went, and which problems
(seeds draw their own held-out problems) and which samples the evaluation drew. The second part is
measured inside each seed from its problem records, by a paired bootstrap over problems (the draw:
problems and their samples) and by each problem's variance over fresh samples (``samples_variance``:
the samples alone); training's part is what the seed-to-seed variance has beyond the draw. With
``var_seed(P, n) = var_train + var_problems * P0 / P + var_samples * P0 * n0 / (P * n)`` (P0
problems of n0 samples measured) a study of S seeds has the interval half-width
``t(0.975, S - 1) * sqrt(var_seed / S)``, and ``cheapest_designs`` searches (P, n, S) for the least
compute that reaches a target half-width.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from scipy import optimize, special

from semrl.studies.distributions import betabinom_logpmf, chi2_ppf, t_ppf

if TYPE_CHECKING:
    from semrl.studies.discovery import Run

METRIC_HELP = "pass@k, mean@n, distinct_answers or response_length/correct"


@dataclass(frozen=True)
class Samples:
    """One variant's evaluation of one split at one step, as arrays over P problems x n samples."""

    correct: np.ndarray  # (P, n) bool
    lengths: np.ndarray  # (P, n) response lengths in tokens
    clusters: np.ndarray  # (P, n) answer class within the problem; -1: no answer

    @classmethod
    def from_records(cls, records: Sequence[dict[str, Any]]) -> Samples:
        """From problem records (``semrl.evaluation``'s module docstring)."""
        rows = [r["samples"] for r in records]
        return cls(
            np.array([[s["correct"] for s in row] for row in rows], dtype=bool),
            np.array([[s["length"] for s in row] for row in rows], dtype=float),
            np.array([[s["cluster"] if s["answer"] is not None else -1 for s in row] for row in rows]),
        )

    def take(self, problems: np.ndarray, samples: np.ndarray | None = None) -> Samples:
        """Problems ``problems`` (P',), and within them the samples ``samples`` (P', n') if given."""
        out = [a[problems] for a in (self.correct, self.lengths, self.clusters)]
        if samples is not None:
            out = [np.take_along_axis(a, samples, axis=1) for a in out]
        return Samples(*out)


@functools.lru_cache(maxsize=64)
def _pass_at_k_table(n: int, k: int) -> np.ndarray:
    """(n + 1,): the unbiased pass@k of a problem with j of n samples correct, for j = 0..n."""
    table = np.array([1.0 - math.comb(n - j, k) / math.comb(n, k) for j in range(n + 1)])
    table.flags.writeable = False
    return table


def _distinct_counts(clusters: np.ndarray) -> np.ndarray:
    """(P,): the number of distinct answer classes (>= 0) in each row of ``clusters`` (P, n)."""
    ordered = np.sort(clusters, axis=1)
    first_of_class = np.ones_like(ordered, dtype=bool)
    first_of_class[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    return cast("np.ndarray", (first_of_class & (ordered >= 0)).sum(axis=1))


def _pass_at_k_per_problem(metric: str, correct: np.ndarray) -> np.ndarray:
    """(P,): each problem's unbiased pass@k, ``metric`` = "pass@k", from ``correct`` (P, n)."""
    n, k = correct.shape[1], int(metric.split("@")[1])
    if not 1 <= k <= n:
        raise ValueError(f"{metric} needs 1 <= k <= {n} samples per problem")
    return cast("np.ndarray", _pass_at_k_table(n, k)[correct.sum(axis=1)])


def metric_value(metric: str, samples: Samples) -> float:
    """``metric`` over the problems as ``semrl.evaluation.summarize_records`` computes it."""
    correct = samples.correct
    if metric.startswith("pass@"):
        return float(_pass_at_k_per_problem(metric, correct).mean())
    if metric.startswith("mean@"):
        return float(correct.mean())
    if metric == "distinct_answers":
        return float(np.mean(_distinct_counts(samples.clusters)))
    if metric == "response_length/correct":
        return float(samples.lengths[correct].mean()) if correct.any() else 0.0
    raise ValueError(f"no variance decomposition for metric '{metric}'; use {METRIC_HELP}")


def _leave_one_out(metric: str, samples: Samples) -> np.ndarray:
    """(P, n): ``metric`` (distinct answers, correct-response length) with sample j of problem i left
    out."""
    correct, lengths, clusters = samples.correct, samples.lengths, samples.clusters
    p, n = correct.shape
    if metric == "distinct_answers":
        counts = _distinct_counts(clusters)
        alone = np.zeros((p, n))
        for i, row in enumerate(clusters):
            for j, c in enumerate(row):
                alone[i, j] = c >= 0 and int((row == c).sum()) == 1  # its class disappears without it
        return cast("np.ndarray", (counts.sum() - alone) / p)
    if metric == "response_length/correct":
        total, count = float(lengths[correct].sum()), int(correct.sum())
        num = total - lengths * correct
        den = count - correct.astype(int)
        return np.where(den > 0, num / np.maximum(den, 1), 0.0)
    raise ValueError(f"no variance decomposition for metric '{metric}'; use {METRIC_HELP}")


def fit_beta_binomial(counts: np.ndarray, n: int) -> tuple[float, float]:
    """Maximum-likelihood Beta(a, b) of the problems' success probabilities, from their counts of
    correct samples out of n (a beta-binomial fit)."""

    def loss(log_ab: np.ndarray) -> float:
        a, b = np.exp(log_ab)
        return -float(betabinom_logpmf(counts, n, a, b).sum())

    fit = optimize.minimize(loss, np.zeros(2), method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-6})
    a, b = np.exp(np.clip(fit.x, -8.0, 8.0))
    return float(a), float(b)


def pass_at_k_sampling_variance(counts: np.ndarray, n: int, k: int) -> np.ndarray:
    """(P,): for each problem with ``counts[i]`` of n samples correct, an estimate of the variance of
    its unbiased pass@k estimate over fresh draws of its n samples.

    Where 2k <= n the unbiased estimate q_k^2 - q_2k, with q_m = C(n - c, m) / C(n, m) (the square of
    pass@k is 1 - 2 (1 - p)^k + (1 - p)^2k, each power estimated without bias); p(1 - p) / (n - 1) for
    k = 1. Where 2k > n no unbiased estimate exists: Var(est | p) averaged over p's posterior under a
    beta prior fitted to all the problems (empirical Bayes, ``fit_beta_binomial``)."""
    c = np.asarray(counts)

    def q(m: int) -> np.ndarray:
        return np.array([math.comb(n - j, m) / math.comb(n, m) for j in range(n + 1)])

    if 2 * k <= n:
        return cast("np.ndarray", (q(k) ** 2 - q(2 * k))[c])
    est = 1.0 - q(k)
    a, b = fit_beta_binomial(c, n)
    table = np.empty(n + 1)
    for j in range(n + 1):  # in closed form under the posterior Beta(a + j, b + n - j)
        pa, pb = a + j, b + n - j
        second = float(np.exp(betabinom_logpmf(np.arange(n + 1), n, pa, pb)) @ est**2)  # E[est^2]

        def moment(m: int, pa: float = pa, pb: float = pb) -> float:  # E[(1 - p)^m]
            return math.exp(special.betaln(pa, pb + m) - special.betaln(pa, pb))

        table[j] = second - (1 - 2 * moment(k) + moment(2 * k))
    return cast("np.ndarray", table[c])


def samples_variance(metric: str, samples: Samples) -> float:
    """The variance of ``metric`` over fresh samples of the same problems. pass@k and mean@n: the sum
    over problems of ``pass_at_k_sampling_variance`` / P^2. Otherwise the stratified delete-one
    jackknife, sum over problems of (n - 1) / n x the squared spread of that problem's leave-one-out
    values (Efron & Stein 1981); for the count of distinct answers it overstates the variance (up to
    about 2x in tests/studies/test_variance.py)."""
    p, n = samples.correct.shape
    if metric.startswith(("pass@", "mean@")):
        k = 1 if metric.startswith("mean@") else int(metric.split("@")[1])
        return float(pass_at_k_sampling_variance(samples.correct.sum(axis=1), n, k).sum() / p**2)
    loo = _leave_one_out(metric, samples)
    return float((n - 1) / n * ((loo - loo.mean(axis=1, keepdims=True)) ** 2).sum())


def draw_variances(
    metric: str, a: Samples, b: Samples, reps: int, rng: np.random.Generator
) -> tuple[float, float]:
    """(draw, samples): the variance of ``metric(a) - metric(b)`` when problems are drawn again with
    their samples (a paired bootstrap over problems: one draw for both variants), and when only each
    problem's samples are drawn again (``samples_variance`` of each variant, summed)."""
    p, n = a.correct.shape
    if b.correct.shape != (p, n):
        raise ValueError(
            f"the two variants' evaluations differ in shape: {a.correct.shape} vs {b.correct.shape}"
        )
    if metric.startswith("pass@"):  # each problem's pass@k drawn again: metric_value's numbers, 2.8x sooner
        per_a, per_b = _pass_at_k_per_problem(metric, a.correct), _pass_at_k_per_problem(metric, b.correct)

        def difference(idx: np.ndarray) -> float:
            return float(per_a[idx].mean()) - float(per_b[idx].mean())

    else:

        def difference(idx: np.ndarray) -> float:
            return metric_value(metric, a.take(idx)) - metric_value(metric, b.take(idx))

    draw = np.array([difference(np.asarray(rng.integers(0, p, size=p))) for _ in range(reps)])
    return float(draw.var(ddof=1)), samples_variance(metric, a) + samples_variance(metric, b)


@dataclass(frozen=True)
class Decomposition:
    """The variance of a per-seed difference split into the evaluation's draw and training.

    ``var_total`` is the seeds' sample variance of D_s (S - 1 degrees of freedom; ``var_total_ci`` its
    95% chi-square interval); ``var_draw`` the mean over seeds of the paired problem bootstrap, of
    which ``var_samples`` comes from the samples alone; ``var_train`` = var_total - var_draw, floored
    at 0 (``var_train_raw`` unfloored)."""

    metric: str
    pair: tuple[str, str]
    differences: tuple[float, ...]
    problems: int
    samples: int
    var_total: float
    var_total_ci: tuple[float, float]
    var_draw: float
    var_samples: float
    var_train_raw: float

    @property
    def var_train(self) -> float:
        return max(self.var_train_raw, 0.0)

    @property
    def var_problems(self) -> float:
        return max(self.var_draw - self.var_samples, 0.0)

    @property
    def draw_share(self) -> float:
        """The draw's share of the seed-to-seed variance (may exceed 1 with few seeds)."""
        return self.var_draw / self.var_total if self.var_total > 0 else float("nan")


def decompose(
    metric: str,
    pair: tuple[str, str],
    seeds: Sequence[tuple[Samples, Samples]],
    reps: int = 400,
    seed: int = 0,
) -> Decomposition:
    """The decomposition of ``metric(A) - metric(B)`` from each seed's (A, B) evaluations."""
    if len(seeds) < 2:
        raise ValueError("a variance decomposition needs at least 2 seeds")
    rng = np.random.default_rng(seed)
    diffs = [metric_value(metric, a) - metric_value(metric, b) for a, b in seeds]
    parts = [draw_variances(metric, a, b, reps, rng) for a, b in seeds]
    var_total = float(np.var(diffs, ddof=1))
    df = len(diffs) - 1
    ci = (df * var_total / chi2_ppf(0.975, df), df * var_total / chi2_ppf(0.025, df))
    var_draw = float(np.mean([d for d, _ in parts]))
    p, n = seeds[0][0].correct.shape
    return Decomposition(
        metric,
        pair,
        tuple(diffs),
        p,
        n,
        var_total,
        ci,
        var_draw,
        float(np.mean([s for _, s in parts])),
        var_total - var_draw,
    )


def half_width(var_seed: float, seeds: int) -> float:
    """The 95% t-interval half-width of the mean of ``seeds`` per-seed differences."""
    return float(t_ppf(0.975, seeds - 1) * math.sqrt(var_seed / seeds))


def var_per_seed(d: Decomposition, problems: int, samples: int, var_train: float | None = None) -> float:
    """Var(D_s) for an evaluation of ``problems`` x ``samples`` (``var_train`` replaces the estimate,
    e.g. the upper end of its range)."""
    train = d.var_train if var_train is None else var_train
    return (
        train
        + d.var_problems * d.problems / problems
        + d.var_samples * d.problems * d.samples / (problems * samples)
    )


@dataclass(frozen=True)
class Design:
    """One evaluation design (problems x samples x seeds), its interval half-width and its compute."""

    problems: int
    samples: int
    seeds: int
    half_width: float
    cost_s: float  # compute of the whole design, in seconds


def cheapest_designs(
    d: Decomposition,
    target: float,
    seed_cost_s: float,
    sample_cost_s: float,
    problems: Sequence[int] = (32, 64, 128, 256, 512),
    samples: Sequence[int] = (16, 32),
    max_seeds: int = 40,
    var_train: float | None = None,
    evaluations: int = 1,
) -> list[Design]:
    """For every (problems, samples) the fewest seeds whose half-width is <= ``target``, cheapest
    first. Per seed the design costs ``seed_cost_s`` (training, per seed of the pair) plus
    ``evaluations`` x problems x samples x ``sample_cost_s`` (the evaluations the pair's rule reads)."""
    designs = []
    for p in problems:
        for n in samples:
            v = var_per_seed(d, p, n, var_train)
            s = next((s for s in range(2, max_seeds + 1) if half_width(v, s) <= target), None)
            if s is not None:
                cost = s * (seed_cost_s + evaluations * p * n * sample_cost_s)
                designs.append(Design(p, n, s, half_width(v, s), cost))
    return sorted(designs, key=lambda x: x.cost_s)


VARIANCE_METRICS = ("pass@1", "pass@4", "pass@16", "distinct_answers", "response_length/correct")


def final_samples(run: Run, split: str) -> Samples | None:
    """The problem records of ``run``'s final evaluation of ``split``, or None without one."""
    from semrl.core.jsonl import log_exists, read_jsonl
    from semrl.evaluation import records_path

    steps = run.eval_steps(split)
    if not steps or steps[-1] == 0:
        return None
    path = records_path(run.run_dir, split, steps[-1])
    return Samples.from_records(read_jsonl(path)) if log_exists(path) else None


def variance_section(
    groups: dict[str, list[Run]],
    pairs: Sequence[tuple[str, str]],
    split: str = "eval",
    metrics: Sequence[str] = VARIANCE_METRICS,
    reps: int = 400,
) -> str:
    """Markdown: for each pair and metric, the seed-to-seed variance of the final difference split
    into the evaluation's draw (problems, samples) and training, from the runs' problem records
    (``semrl compare SWEEP --variance``)."""
    lines = [
        f"## Where the variance is ({split}, final evaluation)",
        "",
        "Per-seed difference D = A - B. var(D): across seeds [95% chi-square interval]; draw: paired "
        "bootstrap over each seed's problems, of which samples: each problem's samples drawn again; "
        "training = var(D) - draw (floored at 0). Shares are of var(D).",
        "",
        "| A - B | metric | seeds | P x n | var(D) [95% CI] | draw (samples) | training | draw share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a, b in pairs:
        by_seed = {r.seed: r for r in groups[b]}
        paired = []
        for run in groups[a]:
            if run.seed in by_seed:
                sa, sb = final_samples(run, split), final_samples(by_seed[run.seed], split)
                if sa is not None and sb is not None and sa.correct.shape == sb.correct.shape:
                    paired.append((sa, sb))
        if len(paired) < 2:
            continue
        n = paired[0][0].correct.shape[1]
        for metric in metrics:
            if metric.startswith("pass@") and int(metric.split("@")[1]) > n:
                continue
            d = decompose(metric, (a, b), paired, reps)
            lo, hi = d.var_total_ci
            lines.append(
                f"| {a} - {b} | {metric} | {len(paired)} | {d.problems} x {d.samples} | {d.var_total:.3g} "
                f"[{lo:.2g}, {hi:.2g}] | {d.var_draw:.3g} ({d.var_samples:.3g}) | {d.var_train:.3g} | "
                f"{d.draw_share:.0%} |"
            )
    return "\n".join(lines) + "\n"
