"""Reward workers started from multiprocessing's fork server (semrl's default where there is one)
against ``spawn``, in one run: what a pool pays to start, to replace a worker killed at its
time-out, and to start again in the same process.

    python benchmarks/bench_reward_workers.py [--repeats 3] [--workers 2]

Each method runs in a fresh process (the fork server is started once per process), the two
alternated, ``--repeats`` times. A process times: a pool of ``--workers`` workers until every one
has imported math-verify (``wait_ready``); one answer that math-verify cannot finish, through its
1 s time-out, and the replacement of that worker until it is ready again (the time-out itself
subtracted); then a second pool in the same process. Prints a Markdown table of medians and the
forkserver / spawn ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tables import print_median_ratio_table

METHODS = ("spawn", "forkserver")
# math-verify evaluates this for far longer than any time-out (tests/reward/test_reward.py)
HANG = r"\dfrac{5^{(5^{(5^{(5^5)})}-4)}-5}{16}"
TIMEOUT_S = 1.0


def child(method: str, workers: int) -> dict[str, float]:
    import multiprocessing as mp

    import semrl.reward.verify as verify

    if method == "spawn":
        verify.worker_context = lambda: mp.get_context("spawn")  # type: ignore[assignment]
    out = {}
    start = time.perf_counter()
    pool = verify.VerifierPool(workers, TIMEOUT_S, numeral_answers=False)
    pool.wait_ready()
    out["first pool ready (s)"] = time.perf_counter() - start
    start = time.perf_counter()
    assert pool.verify_many([("3", HANG)])[0].timed_out
    pool.wait_ready()
    out["replacement after a time-out (s)"] = time.perf_counter() - start - TIMEOUT_S
    pool.close()
    start = time.perf_counter()
    with verify.VerifierPool(workers, TIMEOUT_S) as again:
        again.wait_ready()
        out["second pool ready (s)"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.workers)))
        return
    readings: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    for _ in range(args.repeats):
        for method in METHODS:
            run = subprocess.run(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--child",
                    method,
                    "--workers",
                    str(args.workers),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            readings[method].append(json.loads(run.stdout.strip().splitlines()[-1]))
    print(f"{args.workers} workers, {args.repeats} fresh processes per method, medians\n")
    print_median_ratio_table(readings, "spawn", "forkserver")


if __name__ == "__main__":
    main()
