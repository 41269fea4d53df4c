"""Exploration at equal cost, with problems as the unit (issue 62, item 4; docs/evaluation.md,
"Exploration at equal cost").

At a fixed policy, a rollout method spends sampled tokens on a problem and returns leaves: complete
responses, each correct or not, each with an answer class (answers equivalent under math-verify
share one). The question is what the method finds per token, compared with independent sampling
from the same policy at the same cost.

Independent sampling is the reference because its value at any budget is known without bias: from
n independent samples of a problem with mean length L, k samples cost k L tokens in expectation,
and the chance that k of them (drawn without replacement from the n) contain a correct one is the
pass@k estimator of Chen et al. 2021. A tree that spent T tokens is compared with independent
sampling at k* = T / L samples: not a whole number, so independent sampling draws floor(k*) or
floor(k*) + 1 samples with the probabilities that make its expected cost exactly T (randomised
rounding), and its expected value is the linear interpolation between the two. Nothing about the
tree's own shape enters. n must reach k*: ``IndependentSamples.at_cost`` refuses otherwise.

Per problem, at equal cost (each a number that independent sampling's estimator gives exactly):

- ``solved``: whether any leaf is correct (independent: pass@k*);
- ``distinct_answers``: answer classes among the leaves that answered (independent: the expected
  number of classes among k* samples, sum over classes of 1 - C(n - m, k) / C(n, k));
- ``distinct_correct``: correct answer classes (a problem with one gold has at most one unless the
  verifier splits equivalent forms; it counts forms a policy reaches).

A problem's difference method - independent is its unit: ``paired_differences`` gives them per
problem, averaged over the method's seeds, ready for ``semrl.studies.designs.judge_looks`` with
problems in place of seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

EQUAL_COST_METRICS = ("solved", "distinct_answers", "distinct_correct")


@dataclass(frozen=True)
class Leaves:
    """What one rollout of one problem returned, and what it cost.

    Attributes:
        problem: the problem's id.
        sampled_tokens: tokens the engine sampled for this problem (a tree counts shared prefixes once).
        correct: per leaf, whether its answer is correct.
        clusters: per leaf, its answer class (equal ids: equivalent answers); None: it gave no answer.
    """

    problem: str
    sampled_tokens: int
    correct: tuple[bool, ...]
    clusters: tuple[int | None, ...]

    def __post_init__(self) -> None:
        if len(self.correct) != len(self.clusters):
            raise ValueError(
                f"problem {self.problem}: {len(self.correct)} verdicts for {len(self.clusters)} leaves"
            )
        if any(ok and cluster is None for ok, cluster in zip(self.correct, self.clusters, strict=True)):
            raise ValueError(f"problem {self.problem}: a correct leaf without an answer class")

    def value(self, metric: str) -> float:
        """This rollout's ``metric`` (module docstring)."""
        if metric == "solved":
            return float(any(self.correct))
        if metric == "distinct_answers":
            return float(len({c for c in self.clusters if c is not None}))
        if metric == "distinct_correct":
            return float(len({c for c, ok in zip(self.clusters, self.correct, strict=True) if ok}))
        raise ValueError(f"unknown metric {metric!r}; the metrics are {', '.join(EQUAL_COST_METRICS)}")


def _absent_from(n: int, members: int, k: int) -> float:
    """P(none of ``members`` marked samples is among k drawn without replacement from n):
    C(n - members, k) / C(n, k)."""
    if k == 0:
        return 1.0
    if n - members < k:
        return 0.0
    return math.comb(n - members, k) / math.comb(n, k)


@dataclass(frozen=True)
class IndependentSamples:
    """n independent samples of one problem from the policy: the reference at any cost.

    Attributes:
        problem: the problem's id.
        lengths: each sample's response tokens (what sampling it cost).
        correct: each sample's verdict.
        clusters: each sample's answer class; None: no answer.
    """

    problem: str
    lengths: tuple[int, ...]
    correct: tuple[bool, ...]
    clusters: tuple[int | None, ...]

    @property
    def n(self) -> int:
        return len(self.lengths)

    @property
    def mean_length(self) -> float:
        return sum(self.lengths) / self.n

    def at_k(self, metric: str, k: int) -> float:
        """The expected ``metric`` of k of the n samples drawn without replacement (k = 0: 0)."""
        n = self.n
        if not 0 <= k <= n:
            raise ValueError(f"problem {self.problem}: k={k} outside 0..{n}")
        if metric == "solved":
            return 1.0 - _absent_from(n, sum(self.correct), k)
        if metric in ("distinct_answers", "distinct_correct"):
            sizes: dict[int, int] = {}
            for cluster, ok in zip(self.clusters, self.correct, strict=True):
                if cluster is not None and (ok or metric == "distinct_answers"):
                    sizes[cluster] = sizes.get(cluster, 0) + 1
            return sum(1.0 - _absent_from(n, m, k) for m in sizes.values())
        raise ValueError(f"unknown metric {metric!r}; the metrics are {', '.join(EQUAL_COST_METRICS)}")

    def at_cost(self, metric: str, tokens: float) -> float:
        """The expected ``metric`` of independent sampling that costs ``tokens`` in expectation:
        floor(k*) or floor(k*) + 1 samples, k* = tokens / mean length, mixed so that the expected
        cost is exactly ``tokens`` (module docstring)."""
        if self.mean_length <= 0:
            raise ValueError(f"problem {self.problem}: independent samples of length 0 cost nothing")
        k_star = tokens / self.mean_length
        whole = math.floor(k_star)
        if k_star > self.n:
            raise ValueError(
                f"problem {self.problem}: equal cost needs {k_star:.2f} independent samples, but only "
                f"{self.n} were drawn; sample more (--independent-samples >= {math.ceil(k_star) + 1})"
            )
        fraction = k_star - whole
        low = self.at_k(metric, whole)
        return low if fraction == 0 else (1 - fraction) * low + fraction * self.at_k(metric, whole + 1)


def paired_differences(
    method: Sequence[Leaves], independent: dict[str, IndependentSamples], metric: str
) -> dict[str, float]:
    """problem -> the method's ``metric`` minus independent sampling's at the same cost, each
    rollout of the problem (one per seed) compared at its own cost, averaged over them."""
    per_problem: dict[str, list[float]] = {}
    for leaves in method:
        reference = independent.get(leaves.problem)
        if reference is None:
            raise ValueError(f"problem {leaves.problem} has no independent samples to compare with")
        difference = leaves.value(metric) - reference.at_cost(metric, leaves.sampled_tokens)
        per_problem.setdefault(leaves.problem, []).append(difference)
    return {problem: sum(d) / len(d) for problem, d in per_problem.items()}


def per_token(method: Sequence[Leaves], metric: str) -> float:
    """The method's ``metric`` per 1,000 sampled tokens, pooled over its rollouts (a ratio of sums)."""
    tokens = sum(leaves.sampled_tokens for leaves in method)
    return 1000 * sum(leaves.value(metric) for leaves in method) / tokens if tokens else math.nan
