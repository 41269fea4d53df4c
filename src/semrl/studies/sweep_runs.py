"""A sweep's run on disk and its execution: its state (new, partial, done), the check that a run
directory holds the run the sweep file asks for, the ``semrl train`` command that starts or resumes
it, its wall clock over every process that ran it, and running it to completion
(``semrl.studies.sweep`` describes the files)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from semrl.config.load import load_config
from semrl.core.atomic import write_text_atomic
from semrl.core.jsonl import log_exists
from semrl.data.problem_sets import eval_problems_named
from semrl.studies.discovery import DONE_FILE
from semrl.studies.sweep import TIME_EVERY_S, TIME_FILE, Sweep, SweepError, SweepRun


def run_state(run: SweepRun) -> str:
    """'done', 'resume' (holds a run with a valid checkpoint), 'restart' (holds a run without one)
    or 'new'."""
    from semrl.runtime.checkpoint import list_checkpoints, resumable_checkpoint

    if (run.run_dir / DONE_FILE).exists():
        return "done"
    if not run.run_dir.exists() or not (
        list_checkpoints(run.run_dir) or log_exists(run.run_dir / "metrics.jsonl")
    ):
        return "new"
    return "resume" if resumable_checkpoint(run.run_dir)[0] is not None else "restart"


def check_run_config(sweep: Sweep, run: SweepRun) -> None:
    """Refuse to continue or skip a run directory written with other settings than the sweep's."""
    held = run.run_dir / "config.yaml"
    if not held.exists():
        return
    wanted = load_config(sweep.base, list(run.overrides)).to_dict()
    found = load_config(held).to_dict()
    for settings in (wanted, found):  # runs from before data.eval=auto named the same problems
        settings["data"]["eval"] = eval_problems_named(settings["data"])
    if wanted["model"]["dtype"] == "auto":  # a run records the dtype auto resolved to
        wanted["model"]["dtype"] = found["model"]["dtype"]
    diff = [
        f"{section}.{key}"
        for section in wanted
        for key in wanted[section]
        if found.get(section, {}).get(key) != wanted[section][key]
    ]
    if diff:
        raise SweepError(
            f"{run.run_dir} holds a run with other settings ({', '.join(diff[:6])}); the sweep file changed "
            "since it ran: use another output_dir, or delete that run directory to run it again"
        )


def train_command(run: SweepRun, base: Path | None, state: str) -> list[str]:
    """The ``semrl train`` command line of a run in ``state`` ('resume' continues it)."""
    command = [sys.executable, "-m", "semrl", "train"]
    if state == "resume":
        return [*command, "--resume", str(run.run_dir)]
    return [*command, *(["--config", str(base)] if base else []), *run.overrides]


def set_aside(run: SweepRun) -> Path:
    """Move a run directory without a valid checkpoint out of the way (nothing is deleted)."""
    target, i = run.run_dir.with_name(f"{run.run_dir.name}.interrupted"), 1
    while target.exists():
        i += 1
        target = run.run_dir.with_name(f"{run.run_dir.name}.interrupted-{i}")
    run.run_dir.rename(target)
    return target


def code_version() -> dict[str, Any]:
    """The code that ran: semrl's version and, from a git checkout, its commit and whether tracked
    files differed from it (a study's runs must all come from its pre-registered commit)."""
    from semrl import __version__  # the code that runs, not the installed distribution's metadata

    source = Path(__file__).resolve().parents[1]  # the semrl package
    info: dict[str, Any] = {"semrl": __version__, "commit": None, "modified": None, "source": str(source)}
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=10
        )
        if commit.returncode == 0:
            status = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=source,
                capture_output=True,
                text=True,
                timeout=10,
            )
            info["commit"], info["modified"] = commit.stdout.strip(), bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def recorded_time(run_dir: Path) -> tuple[float, int]:
    """(wall seconds, number of ``semrl train`` processes) a run has taken so far: 0 for a new run."""
    path = run_dir / TIME_FILE
    if not path.exists():
        return 0.0, 0
    data = json.loads(path.read_text())
    return float(data["seconds"]), int(data["processes"])


class SegmentClock:
    """Adds one process's wall time to ``RUN_DIR/sweep_time.json``: every ``every`` seconds while
    it runs (a sweep that is killed outright loses at most that) and once when it ends, however it
    ends. So ``max_hours`` counts a resumed run's earlier processes too."""

    def __init__(self, run_dir: Path, before: float, processes: int, every: float = TIME_EVERY_S) -> None:
        self.run_dir, self.before, self.processes, self.every = run_dir, before, processes, every
        self.start = time.time()
        self.end: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def seconds(self) -> float:
        """The run's seconds: before this process, and this process's so far (or until it ended)."""
        return self.before + (self.end if self.end is not None else time.time()) - self.start

    def write(self) -> None:
        record = {"seconds": round(self.seconds(), 1), "processes": self.processes}
        write_text_atomic(self.run_dir / TIME_FILE, json.dumps(record) + "\n")

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            self.write()

    def __enter__(self) -> SegmentClock:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = time.time()
        self._stop.set()
        self._thread.join()
        self.write()


def execute_run(run: SweepRun, base: Path | None, keep_checkpoints: bool) -> int:
    """Run (or resume) one run to completion in a child process; on success mark it done. Returns
    the exit code of ``semrl train``. Used by both launchers (a submitit job calls it on its node)."""
    state = run_state(run)
    if state == "done":
        return 0
    before, segments = recorded_time(run.run_dir)  # a run set aside still cost its time
    if state == "restart":
        moved = set_aside(run)
        print(f"{run.name}: no valid checkpoint; the partial run moved to {moved}, starting over", flush=True)
        state = "new"
    with SegmentClock(run.run_dir, before, segments + 1) as clock:
        code, interrupted = _call_letting_it_stop(train_command(run, base, state))
    if code == 0:
        if not keep_checkpoints:
            from semrl.runtime.run_state import stage_reference_dirs

            for path in [run.run_dir / "checkpoints", *stage_reference_dirs(run.run_dir)]:
                shutil.rmtree(path, ignore_errors=True)
        record = {
            "variant": run.variant,
            "seed": run.seed,
            "seconds": round(clock.seconds(), 1),  # every process's, resumes included
            "processes": clock.processes,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "code": code_version(),
        }
        (run.run_dir / DONE_FILE).write_text(json.dumps(record) + "\n")
    if interrupted:
        raise KeyboardInterrupt
    return code


def _call_letting_it_stop(command: list[str]) -> tuple[int, bool]:
    """(exit code, whether Ctrl-C was pressed) of ``command``. Ctrl-C reaches the run too, which
    stops after the step it is in with a checkpoint (a second Ctrl-C: at once), so this waits for
    it rather than kill it as ``subprocess.call`` does a quarter of a second later."""
    proc = subprocess.Popen(command)
    interrupted = False
    while True:
        try:
            return proc.wait(), interrupted
        except KeyboardInterrupt:
            interrupted = True
