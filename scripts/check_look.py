"""Recompute a sequential study's looks from its raw run records, without semrl's code.

    python scripts/check_look.py results/study3 configs/study/study3_rules.yaml

For every look in RESULTS/looks.jsonl and every rule of RULES, the per-seed differences are
rebuilt from the per-problem evaluation records (``eval/eval-step-*.jsonl``: pass@k by the
unbiased estimator of Chen et al. 2021, distinct answer classes among answered samples, length of
the correct samples pooled) or from ``metrics.jsonl`` (training metrics: the mean over the last
``window`` steps; ``collapsed``: more than half the steps with every group's rewards equal), and
the look's estimate, interval at its logged level, t p-value and exact sign-flip p-value are
compared with the logged ones (a ``test: sign`` rule: the median of the non-zero differences, its
order-statistic interval and the exact binomial p-value). The nominal levels themselves come from the
design (docs/evaluation.md, "Designs") and are taken from the log. Exits 1 on any mismatch.
Each rule's line also prints what the write-up shows beside the logged figures and the log does
not hold: the descriptive 95% t-interval and the seeds above / at / below 0 (the test suite checks
docs/results.md's look tables against ``rebuild``).
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import yaml
from scipy import stats

TOLERANCE = 1e-9


def pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def read_lines(path: Path) -> list[dict]:
    """The JSON lines of a record file, plain or gzip-compressed (``FILE.jsonl.gz``, how a finished
    study's records are committed); each file is parsed once while it is unchanged (every rule of
    every look reads the same records)."""
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    stat = path.stat()
    return _parsed(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1024)
def _parsed(path: Path, mtime_ns: int, size: int) -> list[dict]:
    data = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def eval_value(run: Path, metric: str) -> float:
    files = sorted((run / "eval").glob("eval-step-*.jsonl*"))
    records = read_lines(files[-1])
    name = metric.removeprefix("eval/")
    if name.startswith("pass@"):
        k = int(name.split("@")[1])
        return float(
            np.mean(
                [pass_at_k(len(r["samples"]), sum(s["correct"] for s in r["samples"]), k) for r in records]
            )
        )
    if name == "distinct_answers":
        return float(
            np.mean([len({s["cluster"] for s in r["samples"] if s["answer"] is not None}) for r in records])
        )
    if name == "response_length/correct":
        return float(np.mean([s["length"] for r in records for s in r["samples"] if s["correct"]]))
    raise SystemExit(f"check_look.py does not rebuild {metric}; add it here")


def train_value(run: Path, metric: str, window: int) -> float:
    rows = read_lines(run / "metrics.jsonl")
    points = sorted((row["step"], row[metric]) for row in rows if metric in row)
    return float(np.mean([value for _, value in points[-window:]]))


def collapsed(run: Path) -> float:
    """1.0 when more than half of the run's steps had every group's rewards equal, else 0.0."""
    rows = [row for row in read_lines(run / "metrics.jsonl") if row["step"] > 0]
    key = "reward/frac_groups_all_equal"
    shares = {row["step"]: row[key] for row in rows if key in row}
    return float(sum(share >= 1.0 for share in shares.values()) > len(shares) / 2)


def value(results: Path, variant: str, seed: int, rule: dict) -> float:
    run = results / variant / f"seed-{seed}"
    if rule["metric"] == "collapsed":
        return collapsed(run)
    if rule["metric"].startswith("eval/"):
        return eval_value(run, rule["metric"])
    return train_value(run, rule["metric"], int(rule.get("window", 1)))


def sign_flip_p(d: np.ndarray) -> float:
    observed = abs(d.sum())
    sums = [abs(np.dot(signs, d)) for signs in itertools.product((1.0, -1.0), repeat=d.size)]
    return float(np.mean([s >= observed - 1e-12 * max(1.0, observed) for s in sums]))


def sign_test(d: np.ndarray, level: float) -> tuple[float, float, float, float]:
    """(median, low, high, p) of the differences that are not 0: the exact binomial test and the
    order-statistic interval at ``level`` (``test: sign``)."""
    x = np.sort(d[d != 0])
    m = x.size
    p = stats.binomtest(int((x > 0).sum()), m, 0.5).pvalue if m else math.nan
    if m == 0:
        return math.nan, math.nan, math.nan, p
    # the order statistics whose ranks k and m + 1 - k leave at most level / 2 on each side
    ks = [k for k in range(1, m + 1) if 2 * stats.binom.cdf(k - 1, m, 0.5) <= level]
    if not ks:
        return float(np.median(x)), -math.inf, math.inf, p
    k = max(ks)
    return float(np.median(x)), float(x[k - 1]), float(x[m - k]), p


def rebuild(results: Path, rules_file: Path) -> list[dict]:
    """Every logged look with, per rule, the logged line and this script's own figures: the
    per-seed differences, the estimate, the interval at the logged level, the t and sign-flip
    p-values, the descriptive 95% t-interval and the seeds above / at / below 0."""
    rules = {rule["id"]: rule for rule in yaml.safe_load(rules_file.read_text())["rules"]}
    looks = []
    for line in (results / "looks.jsonl").read_text().splitlines():
        look = json.loads(line)
        rebuilt = []
        for logged in look["rules"]:
            rule = rules[logged["id"]]
            variant, baseline = rule["pair"]
            d = np.array(
                [value(results, variant, s, rule) - value(results, baseline, s, rule) for s in look["seeds"]]
            )
            se = d.std(ddof=1) / math.sqrt(d.size)
            half = stats.t.ppf(1 - logged["level"] / 2, d.size - 1) * se
            half95 = stats.t.ppf(0.975, d.size - 1) * se
            if se > 0:
                p_t = 2 * stats.t.sf(abs(d.mean()) / se, d.size - 1)
            else:  # equal differences: the t statistic is infinite, or 0/0 read as no evidence
                p_t = 0.0 if d.mean() != 0 else 1.0
            estimate, low, high = d.mean(), d.mean() - half, d.mean() + half
            mine = {}
            if rule.get("test", "t") == "sign":
                estimate, low, high, mine["p_sign"] = sign_test(d, logged["level"])
            rebuilt.append(
                {
                    **mine,
                    "logged": logged,
                    "differences": d,
                    "estimate": estimate,
                    "low": low,
                    "high": high,
                    "p_t": p_t,
                    "p_sign_flip": sign_flip_p(d),
                    "low95": d.mean() - half95,
                    "high95": d.mean() + half95,
                    "above_at_below": (int((d > 0).sum()), int((d == 0).sum()), int((d < 0).sum())),
                }
            )
        looks.append({"look": look["look"], "seeds": look["seeds"], "rules": rebuilt})
    return looks


LOGGED = ("estimate", "low", "high", "p_t", "p_sign_flip")


def same(mine: float, logged: float | None) -> bool:
    """Equal within TOLERANCE; infinities equal only themselves, and a nan matches only where this
    script computes a nan too (a sign test with every difference 0), never as a silent pass."""
    if logged is None:
        return False
    if math.isnan(mine) or math.isnan(logged):
        return math.isnan(mine) and math.isnan(logged)
    return mine == logged or abs(mine - logged) <= TOLERANCE * max(1.0, abs(mine))


def main(results: Path, rules_file: Path) -> int:
    mismatches = 0
    for look in rebuild(results, rules_file):
        print(f"look {look['look']} at seeds {look['seeds']}")
        for mine in look["rules"]:
            logged = mine["logged"]
            checked = (*LOGGED, *(["p_sign"] if "p_sign" in mine else []))
            bad = [k for k in checked if not same(mine[k], logged.get(k))]
            mismatches += bool(bad)
            print(
                f"  {logged['id']}: {mine['estimate']:+.4f} [{mine['low']:+.3f}, {mine['high']:+.3f}]"
                f" p {mine['p_t']:.3g} / {mine['p_sign_flip']:.3g}, 95% [{mine['low95']:+.3f},"
                f" {mine['high95']:+.3f}], above / at / below {' / '.join(map(str, mine['above_at_below']))},"
                f" per seed {' '.join(f'{x:+.4g}' for x in mine['differences'])}:"
                f" {'MISMATCH ' + ', '.join(bad) if bad else 'matches'}"
            )
    return 1 if mismatches else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
