"""Recompute a sequential study's looks from its raw run records, without semrl's code.

    python scripts/check_look.py results/study3 configs/study/study3_rules.yaml

For every look in RESULTS/looks.jsonl and every rule of RULES, the per-seed differences are
rebuilt from the per-problem evaluation records (``eval/eval-step-*.jsonl``: pass@k by the
unbiased estimator of Chen et al. 2021, distinct answer classes among answered samples, length of
the correct samples pooled) or from ``metrics.jsonl`` (training metrics: the mean over the last
``window`` steps), and the look's estimate, interval at its logged level, t p-value and exact
sign-flip p-value are compared with the logged ones. The nominal levels themselves come from the
design (docs/evaluation.md, "Designs") and are taken from the log. Exits 1 on any mismatch.
Each rule's line also prints what the write-up shows beside the logged figures and the log does
not hold: the descriptive 95% t-interval and the seeds above / at / below 0 (the test suite checks
docs/results.md's look tables against ``rebuild``).
"""

from __future__ import annotations

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
    study's records are committed)."""
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
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


def value(results: Path, variant: str, seed: int, rule: dict) -> float:
    run = results / variant / f"seed-{seed}"
    if rule["metric"].startswith("eval/"):
        return eval_value(run, rule["metric"])
    return train_value(run, rule["metric"], int(rule.get("window", 1)))


def sign_flip_p(d: np.ndarray) -> float:
    observed = abs(d.sum())
    sums = [abs(np.dot(signs, d)) for signs in itertools.product((1.0, -1.0), repeat=d.size)]
    return float(np.mean([s >= observed - 1e-12 * max(1.0, observed) for s in sums]))


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
            rebuilt.append({
                "logged": logged,
                "differences": d,
                "estimate": d.mean(),
                "low": d.mean() - half,
                "high": d.mean() + half,
                "p_t": p_t,
                "p_sign_flip": sign_flip_p(d),
                "low95": d.mean() - half95,
                "high95": d.mean() + half95,
                "above_at_below": (int((d > 0).sum()), int((d == 0).sum()), int((d < 0).sum())),
            })
        looks.append({"look": look["look"], "seeds": look["seeds"], "rules": rebuilt})
    return looks


LOGGED = ("estimate", "low", "high", "p_t", "p_sign_flip")


def main(results: Path, rules_file: Path) -> int:
    mismatches = 0
    for look in rebuild(results, rules_file):
        print(f"look {look['look']} at seeds {look['seeds']}")
        for mine in look["rules"]:
            logged = mine["logged"]
            # written so that a nan on either side is a mismatch, not a silent pass
            bad = [k for k in LOGGED if not abs(mine[k] - logged[k]) <= TOLERANCE * max(1.0, abs(mine[k]))]
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
