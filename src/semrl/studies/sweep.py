"""Sweeps: one base config, named variants (each a set of overrides) times a list of seeds.

A sweep file (YAML; paths in it are relative to the file)::

    base: ../demo.yaml                  # the config every run starts from
    output_dir: runs/study              # OUT: each run goes to OUT/VARIANT/seed-S
    seeds: [0, 1, 2]
    overrides: {trainer.steps: 20}      # applied to every run (dotted keys or nested sections)
    variants:                           # name -> overrides on top
      dr_grpo: {algorithm.method: dr_grpo}
      rose: {algorithm.method: rose, rose.epsilon: 0.5}
    keep_checkpoints: true              # false: a finished run's checkpoints are deleted
    slurm: {partition: gpu, gpus_per_node: 1, timeout_min: 240, array_parallelism: 8}

Every run's config is built and validated when the file is loaded, so a bad grid (an unknown key,
a variant named twice, a seed that is not an integer) fails before any run starts. A run is *done*
when ``RUN_DIR/sweep_done.json`` exists (written when its ``semrl train`` exits cleanly, with the
wall seconds of every process that ran it, kept as it runs in ``RUN_DIR/sweep_time.json``); a run
directory that holds a run but is not done is resumed from its last valid checkpoint. The
step-0 evaluation of the base model is shared by every run that would sample it identically
(``logging.eval_cache`` = ``OUT/.eval-cache``).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml

from semrl.config.load import load_config
from semrl.core.atomic import write_text_atomic
from semrl.core.jsonl import log_exists
from semrl.data.problem_sets import eval_problems_named
from semrl.errors import ConfigError
from semrl.studies.seeds import DONE_FILE

if TYPE_CHECKING:
    from semrl.config.sections import Config
    from semrl.studies.designs import Design, RulesFile

EVAL_CACHE = ".eval-cache"
TIME_FILE = "sweep_time.json"  # a run's wall seconds so far, over every process that ran it
TIME_EVERY_S = 60.0  # how often a running run's time is written: a killed sweep loses at most this
SWEEP_KEYS = ("base", "output_dir", "seeds", "overrides", "variants", "keep_checkpoints", "slurm")
SLURM_KEYS = (
    "partition",
    "gpus_per_node",
    "cpus_per_task",
    "mem_gb",
    "timeout_min",
    "array_parallelism",
    "account",
)
OWNED_KEYS = ("trainer.seed", "logging.output_dir", "logging.eval_cache")  # the sweep sets these per run
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class SweepError(ConfigError):
    """A sweep file that cannot run; the message names the key and the fix."""


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type information
    """YAML loader that refuses a mapping key given twice (PyYAML keeps the last one silently)."""


def _mapping_without_duplicates(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise SweepError(
                f"the key '{key}' is given twice (line {key_node.start_mark.line + 1}); names must be unique"
            )
        seen.add(key)
    return cast("dict[Any, Any]", loader.construct_mapping(node))


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


@dataclass(frozen=True)
class SweepRun:
    """One run of the grid: a variant at a seed, with the overrides that make its config."""

    variant: str
    seed: int
    run_dir: Path
    overrides: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.variant}/seed-{self.seed}"


@dataclass(frozen=True)
class Sweep:
    """A sweep file read and checked: the base config, seeds, variants (their overrides) and where the
    runs go; ``runs`` lists every (variant, seed) run in order."""

    path: Path
    base: Path | None
    output_dir: Path
    seeds: tuple[int, ...]
    variants: dict[str, tuple[str, ...]]
    keep_checkpoints: bool
    slurm: dict[str, Any]
    runs: tuple[SweepRun, ...] = field(default=())

    def variant_config(self, variant: str, overrides: Sequence[str] = ()) -> Config:
        """``variant``'s config (the base, the sweep's common overrides, the variant's own), then
        ``overrides``; a run of the sweep adds its seed and directories (``SweepRun.overrides``)."""
        if variant not in self.variants:
            raise SweepError(
                f"{self.path} has no variant '{variant}'; its variants: {', '.join(self.variants)}"
            )
        return load_config(self.base, [*self.variants[variant], *overrides])


def _flatten(values: Any, where: str, prefix: str = "") -> dict[str, Any]:
    """``{trainer: {steps: 2}, "rollout.top_k": 5}`` -> ``{"trainer.steps": 2, "rollout.top_k": 5}``."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise SweepError(f"sweep key '{where}' must be a mapping of config keys to values, got {values!r}")
    out: dict[str, Any] = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, where, dotted + "."))
        else:
            out[dotted] = value
    return out


def _override(key: str, value: Any) -> str:
    # JSON is YAML: the value reads back with its type (lists, null, strings that look like numbers)
    return f"{key}={json.dumps(value)}"


def _read_sweep_file(path: Path) -> dict[str, Any]:
    """The sweep file's mapping, its keys checked against ``SWEEP_KEYS``."""
    if not path.is_file():
        raise SweepError(f"sweep file '{path}' does not exist")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except SweepError as err:
        raise SweepError(f"sweep file '{path}': {err}") from None
    except yaml.YAMLError as err:
        raise SweepError(f"sweep file '{path}' is not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise SweepError(f"sweep file '{path}' must be a mapping with keys {', '.join(SWEEP_KEYS)}")
    for key in raw:
        if key not in SWEEP_KEYS:
            raise SweepError(
                f"sweep file '{path}': unknown key '{key}'; the keys are {', '.join(SWEEP_KEYS)}"
            )
    if "output_dir" not in raw or not isinstance(raw["output_dir"], str):
        raise SweepError("sweep key 'output_dir' is missing: the directory that receives OUT/VARIANT/seed-S")
    return raw


def _seeds(raw: dict[str, Any]) -> list[int]:
    seeds = raw.get("seeds", [0])
    integers = isinstance(seeds, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    if not integers or not seeds:
        raise SweepError(f"sweep key 'seeds' must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"sweep key 'seeds' lists a seed twice: {seeds}")
    return cast("list[int]", seeds)


def _settings(raw: dict[str, Any], path: Path) -> tuple[Path | None, dict[str, Any], bool]:
    """(base config, slurm options, keep_checkpoints) of the sweep file at ``path``."""
    base = (path.parent / raw["base"]).resolve() if raw.get("base") else None
    if base is not None and not base.is_file():
        raise SweepError(
            f"sweep key 'base': config file '{base}' does not exist (paths are relative to the sweep file)"
        )
    slurm = raw.get("slurm") or {}
    if not isinstance(slurm, dict) or any(k not in SLURM_KEYS for k in slurm):
        raise SweepError(f"sweep key 'slurm' takes {', '.join(SLURM_KEYS)}; got {slurm!r}")
    keep = raw.get("keep_checkpoints", True)
    if not isinstance(keep, bool):
        raise SweepError(f"sweep key 'keep_checkpoints' must be true or false, got {keep!r}")
    return base, slurm, keep


def _variant_overrides(name: Any, values: Any, common: dict[str, Any]) -> tuple[str, ...]:
    """The overrides of variant ``name``: the sweep's common ones, then its own."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise SweepError(f"variant name {name!r}: use letters, digits and _ . + - (it names a directory)")
    own = _flatten(values, f"variants.{name}")
    for key in (*common, *own):
        if key in OWNED_KEYS:
            raise SweepError(f"variant '{name}': '{key}' is set by the sweep for each run; remove it")
    return tuple(_override(k, v) for k, v in {**common, **own}.items())


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep file; every run's config is built, so errors surface here."""
    path = Path(path)
    raw = _read_sweep_file(path)
    seeds = _seeds(raw)
    base, slurm, keep = _settings(raw, path)
    variants = raw.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise SweepError("sweep key 'variants' must map at least one variant name to its overrides")
    common = _flatten(raw.get("overrides"), "overrides")
    out = Path(raw["output_dir"])
    runs, by_variant = [], {}
    for name, values in variants.items():
        by_variant[name] = overrides = _variant_overrides(name, values, common)
        for seed in seeds:
            run_dir = out / name / f"seed-{seed}"
            run = SweepRun(
                name,
                seed,
                run_dir,
                (
                    *overrides,
                    _override("trainer.seed", seed),
                    _override("logging.output_dir", str(run_dir)),
                    _override("logging.eval_cache", str(out / EVAL_CACHE)),
                ),
            )
            try:
                load_config(base, list(run.overrides))
            except ConfigError as err:
                raise SweepError(f"variant '{name}' (seed {seed}): {err}") from None
            runs.append(run)
    order = sorted(runs, key=lambda r: (seeds.index(r.seed), list(variants).index(r.variant)))  # seed by seed
    return Sweep(path, base, out, tuple(seeds), by_variant, keep, slurm, tuple(order))


# ----------------------------------------------------------------------------------------------
# The state of a run on disk


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
            from semrl.runtime.checkpoint import stage_reference_dirs

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


# ----------------------------------------------------------------------------------------------
# Launchers


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


def _run_with_header(run: SweepRun, sweep: Sweep, echo: Callable[[str], Any]) -> int:
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
        code = _run_with_header(run, sweep, echo)
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


# ----------------------------------------------------------------------------------------------
# Sequential studies


def _check_design(sweep: Sweep, rules: RulesFile) -> Design:
    """The rules' design, checked against the sweep: planned looks the sweep's seeds reach."""
    design = rules.design
    if design is None:
        raise SweepError(
            "--until-decided needs a rules file with a design (fixed or group_sequential looks, "
            "docs/evaluation.md 'Designs'); a plain list of rules plans no looks"
        )
    if design.looks[-1] > len(sweep.seeds):
        raise SweepError(
            f"the design's last look needs {design.looks[-1]} seeds; the sweep file lists "
            f"{len(sweep.seeds)} ({list(sweep.seeds)}): add seeds to 'seeds'"
        )
    named = {name for r in rules.rules for name in (r.variant, r.baseline)}
    if missing := sorted(named - set(sweep.variants)):
        raise SweepError(f"the rules compare variants the sweep does not run: {missing}")
    return design


def _spent_hours(sweep: Sweep) -> float:
    seconds = 0.0
    for run in sweep.runs:
        done = run.run_dir / DONE_FILE
        if done.exists():
            seconds += json.loads(done.read_text()).get("seconds", 0.0)
    return seconds / 3600


def _finished_seeds(sweep: Sweep) -> list[int]:
    """The seeds, in the sweep's order, whose every variant's run is done."""
    return [s for s in sweep.seeds if all(run_state(r) == "done" for r in sweep.runs if r.seed == s)]


def _take_looks(
    sweep: Sweep, rules: RulesFile, design: Design, echo: Callable[[str], Any]
) -> tuple[int, bool]:
    """Judge the looks the finished seeds reach (each appended to ``OUT/looks.jsonl`` once); returns
    (looks taken, whether every primary rule is settled or ruled out)."""
    from semrl.studies.designs import (
        LOOKS_LOG,
        complete_seeds,
        judge_looks,
        judged_rows,
        log_looks,
        primary_done,
    )
    from semrl.studies.seeds import find_runs, rule_differences

    finished = _finished_seeds(sweep)
    if not finished:
        return 0, False
    diffs = rule_differences(find_runs([sweep.output_dir], seeds=finished), rules.rules)
    complete = complete_seeds(diffs)
    looks = judge_looks(diffs, rules, complete)
    for k in log_looks(sweep.output_dir / LOOKS_LOG, looks, design, complete):
        rows = "\n".join(f"  {row[0]}: {row[5]} {row[6]} -> {row[10]}" for row in judged_rows(looks[k - 1]))
        echo(f"look {k} at {design.looks[k - 1]} seeds:\n{rows}")
    return len(looks), bool(looks) and primary_done(looks[-1])


def study_status(sweep: Sweep, rules: RulesFile) -> str:
    """``semrl sweep --dry-run --until-decided RULES``: where a sequential study stands, read from
    its runs' ``sweep_done.json`` and its looks log alone. It judges nothing and reads no metric, so
    it can be run as often as wanted between looks without being one; the runs' list follows."""
    from semrl.studies.designs import LOOKS_LOG, primary_done, read_looks

    design = _check_design(sweep, rules)
    logged = read_looks(sweep.output_dir / LOOKS_LOG)
    seeds = list(sweep.seeds)[: design.looks[-1]]
    states = {run.name: run_state(run) for run in sweep.runs if run.seed in seeds}
    finished = [s for s in _finished_seeds(sweep) if s in seeds]
    hours = _spent_hours(sweep)
    budget = f" of max_hours {design.max_hours:g}" if design.max_hours is not None else ""
    lines = [
        f"sequential study: {design.type} design, looks at {', '.join(map(str, design.looks))} seeds; "
        f"{len(finished)} of {len(seeds)} seeds finished every variant "
        f"({sum(v == 'done' for v in states.values())} of {len(states)} runs); "
        f"runs' hours {hours:.1f}{budget}"
    ]
    for look in logged:
        outcomes = ", ".join(f"{r['id']} {r['outcome']}" for r in look["rules"])
        lines.append(f"look {look['look']} at {len(look['seeds'])} seeds ({look['time']}): {outcomes}")
    if logged and primary_done(logged[-1]["rules"]):
        lines.append(f"stopped at look {len(logged)}: every primary rule is settled")
    elif len(logged) == len(design.looks):
        lines.append(f"stopped: the design's last look ({len(logged)}) is taken")
    elif design.max_hours is not None and hours >= design.max_hours:
        lines.append(
            f"stopped: the runs' hours passed max_hours; the looks it reaches are taken by the next "
            f"`semrl sweep --until-decided`, which then runs nothing (looks taken: {len(logged)})"
        )
    else:
        following = design.looks[len(logged)]
        read = seeds[:following]
        needed = [run.name for run in sweep.runs if run.seed in read and states[run.name] != "done"]
        if not needed:
            needed_text = "every run it reads is finished: the next `semrl sweep --until-decided` takes it"
        else:
            started = [name for name in needed if states[name] != "new"]
            needed_text = f"{len(needed)} run(s) left"
            if started:
                needed_text += f"; started: {', '.join(started)}"
        lines.append(
            f"next: look {len(logged) + 1} at {following} seeds (seeds "
            f"{seeds[0]}-{seeds[following - 1]}): {needed_text}"
        )
    return "\n".join(lines)


def run_until_decided(sweep: Sweep, rules: RulesFile, echo: Callable[[str], Any] = print) -> int:
    """``semrl sweep --until-decided RULES``: seeds one at a time in seed order (every variant of a
    seed, then the next seed), the rules judged at each planned look of their design
    (``semrl.studies.designs``), stopping when every primary rule is decided, decided against or
    ruled out, at the design's last look, or when the runs' hours pass ``design.max_hours``. Runs
    again where it stopped, as ``run_local`` does. Returns 0 when the study stopped by its design."""
    from semrl.runtime.preemption import EXIT_PREEMPTED

    design = _check_design(sweep, rules)
    for run in sweep.runs:
        check_run_config(sweep, run)
    seeds = list(sweep.seeds)[: design.looks[-1]]
    for index, seed in enumerate(seeds):
        taken, settled = _take_looks(sweep, rules, design, echo)
        if settled or taken == len(design.looks):
            why = "every primary rule is settled" if settled else "the design's last look is taken"
            echo(
                f"study stopped at look {taken} of {len(design.looks)}: {why} "
                f"({sweep.output_dir / 'looks.jsonl'})"
            )
            return 0
        if design.max_hours is not None and (hours := _spent_hours(sweep)) >= design.max_hours:
            echo(
                f"study stopped: its runs took {hours:.1f} h, the design's budget is {design.max_hours:g} h "
                f"(max_hours); looks taken: {taken}"
            )
            return 0
        following = next((n for n in design.looks if n > index), None)
        echo(
            f"seed {seed} ({index + 1} of at most {len(seeds)}); looks taken {taken}, "
            f"next at {following} seeds"
        )
        for run in (r for r in sweep.runs if r.seed == seed):
            if run_state(run) == "done":
                continue
            code = _run_with_header(run, sweep, echo)
            if code == EXIT_PREEMPTED or code < 0:
                echo(f"{run.name}: stopped (exit {code}); run the same command again to continue")
                return EXIT_PREEMPTED
            if code != 0:
                echo(
                    f"{run.name}: failed with exit code {code}; see {run.run_dir}. A sequential study "
                    "cannot skip a seed: fix the cause and run the same command again"
                )
                return 1
    taken, settled = _take_looks(sweep, rules, design, echo)
    echo(f"study stopped at look {taken} of {len(design.looks)} ({sweep.output_dir / 'looks.jsonl'})")
    return 0
