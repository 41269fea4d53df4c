"""Evaluation metrics over problem records: unbiased pass@k (Chen et al. 2021), mean@k, maj@k,
lengths, distinct answers (docs/algorithms.md, "Evaluation metrics")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from c correct out of n:
    ``1 - C(n-c, k) / C(n, k)``, computed as a stable product; 1 when ``n - c < k``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def maj_at_k(clusters: Sequence[int], correct: Sequence[bool], has_answer: Sequence[bool], k: int) -> float:
    """Majority-vote accuracy over the first k samples of one problem.

    Samples without an answer do not vote. Ties are split: when t answer classes share the top
    count, the problem scores (number of correct classes among them) / t, the expected accuracy of
    breaking the tie uniformly at random. A class is correct when any of its samples is (its
    members are equivalent answers).
    """
    if not 1 <= k <= len(clusters):
        raise ValueError(f"need 1 <= k <= {len(clusters)} samples, got k={k}")
    votes: dict[int, int] = {}
    right: dict[int, bool] = {}
    for cluster, ok, answered in zip(clusters[:k], correct[:k], has_answer[:k], strict=True):
        if answered:
            votes[cluster] = votes.get(cluster, 0) + 1
            right[cluster] = right.get(cluster, False) or ok
    if not votes:
        return 0.0
    top = max(votes.values())
    leaders = [c for c, v in votes.items() if v == top]
    return sum(right[c] for c in leaders) / len(leaders)


def report_ks(n: int) -> list[int]:
    """The k shown in tables: 1, 2, 4, ... and n (every k <= n is in the JSON)."""
    return sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})


def summarize_records(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Flat metrics over problem records that all have the same number of samples n:
    ``mean@n``, ``pass@k`` and ``maj@k`` for every k <= n, response length (all and correct),
    truncation rate, distinct answers per problem and verification time-outs."""
    if not records:
        raise ValueError("no problem records to summarize")
    n = len(records[0]["samples"])
    if n == 0 or any(len(r["samples"]) != n for r in records):
        raise ValueError("every problem needs the same, non-zero number of samples")
    counts = [sum(s["correct"] for s in r["samples"]) for r in records]
    samples = [s for r in records for s in r["samples"]]
    lengths = np.array([s["length"] for s in samples], dtype=float)
    correct = np.array([s["correct"] for s in samples], dtype=bool)
    out: dict[str, float] = {"problems": float(len(records)), f"mean@{n}": float(np.mean(counts) / n)}
    for k in range(1, n + 1):
        out[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in counts]))
    votes = [  # per problem: (answer classes, correct, has an answer) of its samples
        (
            [s["cluster"] for s in r["samples"]],
            [s["correct"] for s in r["samples"]],
            [s["answer"] is not None for s in r["samples"]],
        )
        for r in records
    ]
    for k in range(1, n + 1):
        out[f"maj@{k}"] = float(np.mean([maj_at_k(*v, k) for v in votes]))
    out["response_length"] = float(lengths.mean())
    out["response_length/correct"] = float(lengths[correct].mean()) if correct.any() else 0.0
    out["truncated_frac"] = float(np.mean([s["truncated"] for s in samples]))
    out["distinct_answers"] = float(
        np.mean([len({s["cluster"] for s in r["samples"] if s["answer"] is not None}) for r in records])
    )
    out["verify_timeouts"] = float(sum(s["timed_out"] for s in samples))
    return out


def summarize_by(records: Sequence[dict[str, Any]], field: str) -> dict[str, dict[str, float]]:
    """``summarize_records`` per value of ``field`` ('level' or 'subject'); empty when no record
    has the field."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get(field) is not None:
            groups.setdefault(str(r[field]), []).append(r)
    return {key: summarize_records(groups[key]) for key in sorted(groups, key=_natural_key)}


def _natural_key(text: str) -> tuple[int, Any]:
    return (0, int(text)) if text.lstrip("-").isdigit() else (1, text)
