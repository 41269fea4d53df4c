"""Verdicts on a quiet machine and beside CPU-bound processes: a wall-clock limit against a CPU budget.

    python benchmarks/bench_verify_under_load.py [--busy 16] [--repeats 3] [--limit-s 5]

The five honest answers of issue 83 go through the trainer's reward (``reward_functions(["math"])``
in a fresh ``VerifierPool``, so that nothing is cached) under two limits: ``wall`` (5 s of wall
clock and no CPU budget, as semrl limited a verification before) and ``cpu`` (5 s of the worker's
CPU time, ``reward.timeout_s``'s default, with its wall-clock net); ``--limit-s`` sets both limits. Each runs alone and beside ``--busy``
processes that spin (``python -c "while True: pass"``, started before and killed after). Runs are
alternated within each repeat. Per run: each answer's reward, the time-outs, the wall seconds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from semrl.reward import VerifierPool, reward_functions

HONEST = [
    ("Factor $x^2+5x+6$.", "\\boxed{(x+3)(x+2)}", "(x+2)(x+3)"),
    ("Expand $(x+2)(x+3)$.", "\\boxed{6 + 5x + x^2}", "x^2+5x+6"),
    ("Simplify the quotient.", "\\boxed{\\frac{x^2-1}{x-1}}", "x+1"),
    ("Write the cube out.", "\\boxed{(x+1)^3}", "x^3+3x^2+3x+1"),
    ("Find the side.", "\\boxed{\\sqrt{8}}", "2\\sqrt{2}"),
]
LIMITS = ("wall", "cpu")


def score(limit: str, seconds: float) -> tuple[list[float], int, float]:
    functions = reward_functions(["math"])
    # wall: semrl before, wall clock alone; cpu: now, CPU time with the wall-clock net at its default
    options = {"timeout_s": 1e9, "wall_timeout_s": seconds} if limit == "wall" else {"timeout_s": seconds}
    with VerifierPool(2, **options) as pool:
        pool.wait_ready()
        start = time.monotonic()
        results, _ = functions.score(
            pool,
            [p for p, _, _ in HONEST],
            [r for _, r, _ in HONEST],
            [[] for _ in HONEST],
            [{"answer": g} for _, _, g in HONEST],
            final_number_fallback=False,
        )
        return [r.reward for r in results], pool.num_timeouts, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--busy", type=int, default=16, help="CPU-bound processes beside the busy runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--limit-s", type=float, default=5.0, help="seconds of each limit (reward.timeout_s: 5)"
    )
    args = parser.parse_args()
    rows = []
    for repeat in range(args.repeats):
        for busy in (0, args.busy):
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
            try:
                time.sleep(1.0 if busy else 0.0)
                for limit in LIMITS if repeat % 2 == 0 else reversed(list(LIMITS)):
                    rewards, timeouts, seconds = score(limit, args.limit_s)
                    rows.append((limit, busy, rewards, timeouts, seconds))
                    print(
                        f"repeat {repeat} {limit:4s} busy {busy:2d}: rewards {rewards} timeouts {timeouts} {seconds:.1f} s",
                        flush=True,
                    )
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.wait()
    print(
        "| limit | processes beside | runs | answers rewarded 1 (of 5), per run | time-outs | wall s (min-max) |"
    )
    print("|---|---|---|---|---|---|")
    for limit in LIMITS:
        for busy in (0, args.busy):
            these = [r for r in rows if r[0] == limit and r[1] == busy]
            paid = ", ".join(str(int(sum(r[2]))) for r in these)
            seconds = [r[4] for r in these]
            print(
                f"| {limit} | {busy} | {len(these)} | {paid} | {sum(r[3] for r in these)} | "
                f"{sum(seconds) / len(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f}) |"
            )


if __name__ == "__main__":
    main()
