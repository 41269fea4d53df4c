"""A demo step alone and beside one CPU-bound process: how much of the slowdown is the share of CPU
the other process takes, and how much is threads waiting for each other.

    python benchmarks/bench_busy_machine.py [--repeats 3] [--settings default libgomp-default ...] [overrides...]

Each run is ``semrl train --config demo trainer.steps=1`` with no evaluation, in a fresh process,
alone or beside ``python -c "while True: pass"`` (started before, killed after). The settings are
environments of the run: ``default`` is semrl's own (``import semrl`` asks OpenMP for a passive
wait, ``semrl.core.threads``); ``libgomp-default`` is the wait libgomp has without a policy, as
before semrl set one (a spin of 300,000 iterations, about 3 ms, before sleeping); ``active`` spins
for minutes (``OMP_WAIT_POLICY=ACTIVE``); ``one-thread`` sets ``OMP_NUM_THREADS=1``.
Runs are alternated (setting x condition within each repeat) so that drift on the machine falls on
all of them. Per run: the step's wall seconds, its rollout and update seconds, and the process's CPU
seconds in rollout + reward and in the update (``time/collect_cpu_s``, ``time/update_cpu_s``), whose
ratio to wall seconds is the cores the process got. The table gives each mean with its min-max, and
busy / alone for the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {
    "default": {},
    # libgomp without OMP_WAIT_POLICY spins 300,000 times (about 3 ms) before it sleeps: the wait of
    # every run before semrl set a policy (GOMP_SPINCOUNT wins over the policy)
    "libgomp-default": {"GOMP_SPINCOUNT": "300000"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
    "one-thread": {"OMP_NUM_THREADS": "1"},
}
STEP = [
    "trainer.steps=1",
    "logging.eval_base=false",
    "data.eval=null",
    "logging.report_to=[]",
    "logging.progress=false",
    "logging.save_every=0",
]
KEYS = (
    "time/step_s",
    "time/rollout_s",
    "time/reward_s",
    "time/update_s",
    "time/collect_cpu_s",
    "time/update_cpu_s",
)


def one_run(setting: str, busy: bool, overrides: list[str], timeout: float) -> dict[str, float] | None:
    """The step's metrics of one ``semrl train`` (None when it ran past ``timeout`` seconds)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, **SETTINGS[setting]}
            command = [
                sys.executable,
                "-m",
                "semrl",
                "train",
                "--config",
                "demo",
                *STEP,
                *overrides,
                f"logging.output_dir={tmp}/run",
            ]
            t0 = time.perf_counter()
            try:
                subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, timeout=timeout)
            except subprocess.TimeoutExpired:  # subprocess.run has killed it (SIGKILL)
                return None
            row = next(
                json.loads(line)
                for line in (Path(tmp) / "run" / "metrics.jsonl").open()
                if '"reward"' in line
            )
            return {**{k: row[k] for k in KEYS}, "process_s": time.perf_counter() - t0}
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def _cell(values: list[float]) -> str:
    return f"{statistics.mean(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--settings", nargs="+", default=["default", "libgomp-default"], choices=list(SETTINGS)
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a run may take")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides of the demo")
    args = parser.parse_args()
    runs: dict[tuple[str, bool], list[dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for setting in args.settings:
            for busy in (False, True):
                got = one_run(setting, busy, args.overrides, args.timeout)
                label = f"{setting}, {'busy' if busy else 'alone'}"
                print(f"repeat {repeat}: {label}: {json.dumps(got)}", file=sys.stderr, flush=True)
                runs.setdefault((setting, busy), []).append(
                    got or {k: float("nan") for k in (*KEYS, "process_s")}
                )
    cores = os.cpu_count()
    print(f"\n{cores} cores, {args.repeats} repeats, overrides {args.overrides or 'none'}\n")
    print(
        "| setting | machine | step s | rollout s | update s | cores used in rollout + reward | cores used in update "
        "| step x alone |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for setting in args.settings:
        alone = statistics.mean(r["time/step_s"] for r in runs[(setting, False)])
        for busy in (False, True):
            rows = runs[(setting, busy)]
            used_rollout = [
                r["time/collect_cpu_s"] / (r["time/rollout_s"] + r["time/reward_s"]) for r in rows
            ]
            used_update = [r["time/update_cpu_s"] / r["time/update_s"] for r in rows]
            ratio = [r["time/step_s"] / alone for r in rows]
            print(
                f"| {setting} | {'beside one CPU-bound process' if busy else 'alone'} "
                f"| {_cell([r['time/step_s'] for r in rows])} | {_cell([r['time/rollout_s'] for r in rows])} "
                f"| {_cell([r['time/update_s'] for r in rows])} | {_cell(used_rollout)} | {_cell(used_update)} "
                f"| {_cell(ratio)} |"
            )


if __name__ == "__main__":
    main()
