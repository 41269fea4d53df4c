"""Launching a sweep: the status table and dry run, every run one after another on this machine,
or one job per run through submitit (slurm, or local processes)."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from semrl.studies.discovery import DONE_FILE
from semrl.studies.sweep import Sweep, SweepError, SweepRun
from semrl.studies.sweep_runs import check_run_config, execute_run, run_state, train_command


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def status_table(
    sweep: Sweep, running: SweepRun | None = None, started: float = 0.0, failed: Sequence[str] = ()
) -> str:
    """Markdown table of every run: state and time."""
    lines = ["| run | state | time |", "|---|---|---|"]
    counts = {"done": 0, "running": 0, "left": 0, "failed": 0}
    for run in sweep.runs:
        done = run.run_dir / DONE_FILE
        if done.exists():
            state, spent = "done", _minutes(json.loads(done.read_text()).get("seconds", 0.0))
        elif run == running:
            state, spent = "running", _minutes(time.time() - started)
        elif run.name in failed:
            state, spent = "failed", ""
        else:
            state, spent = "left", ""
        counts[state] += 1
        lines.append(f"| {run.name} | {state} | {spent} |")
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    return "\n".join([*lines, "", f"{sweep.output_dir}: {summary}"])


def dry_run(sweep: Sweep) -> str:
    """Every run with its state and the command that runs it."""
    lines = [
        f"{len(sweep.runs)} runs ({len(sweep.variants)} variants x {len(sweep.seeds)} seeds) "
        f"into {sweep.output_dir}"
    ]
    for run in sweep.runs:
        state = run_state(run)
        lines.append(f"\n{run.name}  [{state}]  {run.run_dir}")
        if state != "done":
            lines.append("  semrl " + shlex.join(train_command(run, sweep.base, state)[3:]))
    return "\n".join(lines)


def run_with_header(run: SweepRun, sweep: Sweep, echo: Callable[[str], Any]) -> int:
    """``execute_run`` with its header line; Ctrl-C counts as a preemption (exit EXIT_PREEMPTED)."""
    from semrl.runtime.preemption import EXIT_PREEMPTED

    echo(f"\n=== {run.name} ({run_state(run)}) ===")
    try:
        return execute_run(run, sweep.base, sweep.keep_checkpoints)
    except KeyboardInterrupt:
        return EXIT_PREEMPTED


def run_local(sweep: Sweep, echo: Callable[[str], Any] = print) -> int:
    """Runs one after another in this machine's processes; finished runs are skipped, interrupted
    ones resumed. A run that fails is reported and the others go on; a preempted or interrupted
    run stops the sweep (run it again to continue). Returns 0 when every run is done."""
    from semrl.runtime.preemption import EXIT_PREEMPTED

    for run in sweep.runs:
        check_run_config(sweep, run)
    failed: list[str] = []
    for run in sweep.runs:
        if run_state(run) == "done":
            continue
        started = time.time()
        echo(status_table(sweep, run, started, failed))
        code = run_with_header(run, sweep, echo)
        if code == EXIT_PREEMPTED or code < 0:
            echo(f"{run.name}: stopped (exit {code}); run 'semrl sweep {sweep.path}' again to continue")
            return EXIT_PREEMPTED
        if code != 0:
            failed.append(run.name)
            echo(f"{run.name}: failed with exit code {code}; see {run.run_dir}")
    echo(status_table(sweep, failed=failed))
    return 1 if failed else 0


def _submitit_job(run: SweepRun, base: Path | None, keep_checkpoints: bool) -> int:
    code = execute_run(run, base, keep_checkpoints)
    if code != 0:
        raise RuntimeError(f"{run.name}: semrl train exited with {code}; see {run.run_dir}")
    return code


def submit(sweep: Sweep, executor: Any, echo: Callable[[str], Any] = print, wait: bool = False) -> list[Any]:
    """Submit every run that is not done as one job of a submitit job array through ``executor``
    (``submitit.AutoExecutor`` for Slurm, ``submitit.LocalExecutor`` to try it on this machine).
    With ``wait``, block until every job ends and raise the first failure."""
    for run in sweep.runs:
        check_run_config(sweep, run)
    todo = [run for run in sweep.runs if run_state(run) != "done"]
    if not todo:
        echo(status_table(sweep))
        return []
    with executor.batch():
        jobs = [executor.submit(_submitit_job, run, sweep.base, sweep.keep_checkpoints) for run in todo]
    for run, job in zip(todo, jobs, strict=True):
        echo(f"{run.name}: job {job.job_id}")
    if wait:
        for job in jobs:
            job.result()
        echo(status_table(sweep))
    return jobs


def slurm_executor(sweep: Sweep, folder: Path, options: dict[str, Any], cluster: str | None = "slurm") -> Any:
    """A submitit executor with the sweep file's ``slurm`` settings, overridden by ``options``."""
    try:
        import submitit
    except ImportError as err:
        raise SweepError("--launcher slurm needs submitit: pip install 'semrl[slurm]'") from err
    settings = {**sweep.slurm, **{k: v for k, v in options.items() if v is not None}}
    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
    params: dict[str, Any] = {
        "name": f"semrl-{sweep.output_dir.name}",
        "timeout_min": settings.get("timeout_min", 240),
    }
    if cluster == "slurm":
        names = {
            "partition": "slurm_partition",
            "account": "slurm_account",
            "array_parallelism": "slurm_array_parallelism",
        }
        for key, value in settings.items():
            if key in names:
                params[names[key]] = value
        for key in ("gpus_per_node", "cpus_per_task", "mem_gb"):
            if key in settings:
                params[key] = settings[key]
    executor.update_parameters(**params)
    return executor
