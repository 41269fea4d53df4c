"""Two checkouts of semrl side by side on ``bench_tree_rollouts.py``: a refactor's old and new code,
alternated seed by seed in one run (old, new, then new, old, ...), so that a drift of the machine hits
both alike. Each checkout runs in its own process with its own ``src/`` first on the path.

    python benchmarks/compare_checkouts.py --old ../baseline --new . --seeds 0 1 2 [--engines hf vllm]

Prints, per engine and method, the rollout seconds of each code (mean over the seeds) and the ratio
new / old (mean, and min-max of the per-seed ratios), and whether the two sampled the same number of
tokens on every seed (a behaviour-neutral change samples the same tokens).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^(\w+) seed (\d+) ([\w-]+): ([\d.]+) s, (\d+) sampled tokens$")


def run(
    checkout: Path, seed: int, engines: list[str], extra: list[str]
) -> dict[tuple[str, str], tuple[float, int]]:
    """(engine, method) -> (seconds, sampled tokens) of one seed, from ``checkout``'s code."""
    env = {**os.environ, "PYTHONPATH": f"{checkout / 'src'}{os.pathsep}{checkout / 'benchmarks'}"}
    command = [sys.executable, str(checkout / "benchmarks" / "bench_tree_rollouts.py"), "--seeds", str(seed)]
    out = subprocess.run(
        [*command, "--engines", *engines, *extra], env=env, cwd=checkout, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(f"{checkout}: the benchmark failed\n{out.stderr[-3000:]}")
    found = {}
    for line in out.stdout.splitlines():
        if m := LINE.match(line.strip()):
            found[(m[1], m[3])] = (float(m[4]), int(m[5]))
    print(f"  {checkout} seed {seed}: {len(found)} rollouts", flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, default=Path("."))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"])
    parser.add_argument("extra", nargs="*", help="more arguments for bench_tree_rollouts.py (after --)")
    args = parser.parse_args()
    codes = {"old": args.old.resolve(), "new": args.new.resolve()}
    results: dict[str, dict[int, dict]] = defaultdict(dict)
    for i, seed in enumerate(args.seeds):
        order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
        for code in order:
            results[code][seed] = run(codes[code], seed, args.engines, args.extra)
    keys = sorted(results["old"][args.seeds[0]])
    print(
        f"\nold {codes['old']}, new {codes['new']}, seeds {args.seeds} (n = {len(args.seeds)}, alternated)\n"
    )
    print("| engine | method | old s | new s | new / old (min-max) | same sampled tokens |")
    print("|---|---|---|---|---|---|")
    for key in keys:
        old = [results["old"][s][key] for s in args.seeds]
        new = [results["new"][s][key] for s in args.seeds]
        ratios = [n[0] / o[0] for n, o in zip(new, old, strict=True)]
        same = all(n[1] == o[1] for n, o in zip(new, old, strict=True))
        print(
            f"| {key[0]} | {key[1]} | {statistics.mean(o[0] for o in old):.2f} "
            f"| {statistics.mean(n[0] for n in new):.2f} | {statistics.mean(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) | {'yes' if same else 'no'} |"
        )


if __name__ == "__main__":
    main()
