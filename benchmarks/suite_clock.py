"""Where the test suite's wall time goes: each xdist worker's timeline, and whether the machine's
cores were working, waiting or taken by the hypervisor while the tests ran.

    python benchmarks/suite_clock.py [pytest arguments ...]    # e.g. -m unit; none: the whole suite
    python benchmarks/suite_clock.py --report DIR              # the report of an earlier run

It runs ``python -m pytest -p benchmarks.suite_clock ARGS`` (pyproject's addopts apply: 2 workers,
--dist loadgroup). The plugin writes one JSON line per event and process (the controller and each
worker) into ``SEMRL_SUITE_CLOCK_DIR`` (the script sets it: a new temporary directory, named in the report,
unless it is set already): its configure, the end of its collection, each test's start and end,
and its session end, each with the time and the machine's cumulative CPU counters from
/proc/stat (Linux; elsewhere the counters are left out).

The report gives:
- the wall time, and per worker: when its collection ended, the sum of its tests' durations (busy),
  and when its last test ended (the two should end close together: a worker that ends early sat idle);
- the machine's core-seconds over the run: working (user, system), idle (idle, iowait) and stolen
  by the hypervisor (steal). A suite whose idle share is small is CPU-bound: only less CPU work
  makes it faster on these cores, not a better schedule;
- the test time by file and the slowest tests (what ``--durations`` gives, by file as well).

docs/benchmarks.md ("Where the suite's time goes") reports its runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

DIR_ENV = "SEMRL_SUITE_CLOCK_DIR"
STAT = Path("/proc/stat")


def cpu_counters() -> dict[str, float]:
    """The machine's cumulative core-seconds since boot, from /proc/stat's first line: working
    (user, nice, system, irq, softirq), idle (idle, iowait) and steal; empty where there is none."""
    try:
        fields = STAT.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return {}
    ticks = [int(x) for x in fields[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks + [0] * (8 - len(ticks))
    hertz = os.sysconf("SC_CLK_TCK")
    return {
        "work": (user + nice + system + irq + softirq) / hertz,
        "idle": (idle + iowait) / hertz,
        "steal": steal / hertz,
    }


# ---- the plugin (pytest -p benchmarks.suite_clock) ----

_LOG: Any = None


def _write(event: str, **fields: Any) -> None:
    if _LOG is not None:
        _LOG.write(json.dumps({"event": event, "t": time.time(), **cpu_counters(), **fields}) + "\n")
        _LOG.flush()


def pytest_configure(config: Any) -> None:
    global _LOG
    if not os.environ.get(DIR_ENV):  # the script sets it; without it the plugin records nothing
        return
    directory = Path(os.environ[DIR_ENV])
    directory.mkdir(parents=True, exist_ok=True)
    # not PYTEST_XDIST_WORKER: a pytest run started by a test inherits its worker's
    name = config.workerinput["workerid"] if hasattr(config, "workerinput") else "controller"
    _LOG = (directory / f"{name}.jsonl").open("w", encoding="utf-8")
    _write("configure")


def pytest_collection_finish(session: Any) -> None:
    _write("collected")


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write("start", id=nodeid)


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    _write("end", id=nodeid)


def pytest_sessionfinish(session: Any) -> None:
    _write("finish")


# ---- the report ----


def read_events(directory: Path) -> dict[str, list[dict[str, Any]]]:
    """Each process's events, by its name (``controller``, ``gw0`` ...)."""
    return {
        path.stem: [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
        for path in sorted(directory.glob("*.jsonl"))
    }


def spans_of(events: Iterable[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """(node id, start, end) of each test a process ran, in order."""
    spans, started = [], None
    for event in events:
        if event["event"] == "start":
            started = event
        elif event["event"] == "end" and started is not None and started["id"] == event["id"]:
            spans.append((event["id"], started["t"], event["t"]))
            started = None
    return spans


def summarise(processes: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The report's figures: ``wall`` (s), ``workers`` (name -> collected, busy, last_end, tests; times
    in s from the controller's configure), ``cores`` (work, idle, steal core-seconds over the run,
    where the counters exist), ``by_file`` (file -> test seconds) and ``tests`` ((seconds, id), slowest
    first)."""
    controller = processes.get("controller") or next(iter(processes.values()))
    first, last = controller[0], controller[-1]
    origin = first["t"]
    workers, by_file, tests = {}, Counter(), []
    for name, events in processes.items():
        if name == "controller" and len(processes) > 1:
            continue
        spans = spans_of(events)
        collected = next((e["t"] for e in events if e["event"] == "collected"), None)
        workers[name] = {
            "collected": None if collected is None else collected - origin,
            "busy": sum(end - start for _, start, end in spans),
            "last_end": spans[-1][2] - origin if spans else None,
            "tests": len(spans),
        }
        for node, start, end in spans:
            by_file[node.split("::")[0]] += end - start
            tests.append((end - start, node))
    cores = {k: last[k] - first[k] for k in ("work", "idle", "steal") if k in first and k in last}
    return {
        "wall": last["t"] - origin,
        "workers": workers,
        "cores": cores,
        "by_file": by_file,
        "tests": sorted(tests, reverse=True),
    }


def report(summary: dict[str, Any], top: int = 15) -> str:
    wall = summary["wall"]
    lines = [f"wall {wall:.1f} s"]
    for name, w in summary["workers"].items():
        collected = "-" if w["collected"] is None else f"{w['collected']:.1f}"
        last = "-" if w["last_end"] is None else f"{w['last_end']:.1f}"
        lines.append(
            f"  {name}: collected at {collected} s, {w['tests']} tests, busy {w['busy']:.1f} s, "
            f"last test ended at {last} s"
        )
    cores = summary["cores"]
    if cores:
        total = sum(cores.values())
        lines.append(
            f"cores over the run: {total:.0f} core-s ({total / wall:.2f} cores): "
            + ", ".join(f"{k} {v:.0f} ({v / total:.1%})" for k, v in cores.items())
        )
    lines.append(f"test time by file (top {top} of {len(summary['by_file'])}):")
    lines += [f"  {s:7.1f} s  {f}" for f, s in summary["by_file"].most_common(top)]
    lines.append(f"slowest tests (top {top}):")
    lines += [f"  {s:7.1f} s  {node}" for s, node in summary["tests"][:top]]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["--report"]:
        directory = Path(argv[1])
    else:
        directory = Path(os.environ.get(DIR_ENV) or tempfile.mkdtemp(prefix="suite-clock-"))
        env = {**os.environ, DIR_ENV: str(directory)}
        command = [sys.executable, "-m", "pytest", "-p", "benchmarks.suite_clock", *argv]
        status = subprocess.run(command, env=env, check=False).returncode
        if status != 0:
            print(f"pytest ended with status {status}; the report covers the tests that ran")
    print(f"events in {directory}")
    print(report(summarise(read_events(directory))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
