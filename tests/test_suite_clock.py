"""benchmarks/suite_clock.py: its report against a direct count on random timelines, its reading of
/proc/stat, and the script with its plugin around a real 2-worker pytest run."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from benchmarks import suite_clock

ROOT = Path(__file__).resolve().parents[1]


def _random_run(rng: random.Random) -> tuple[dict[str, list[dict]], dict]:
    """The events of a run with 1-3 workers (a worker may run no test, a test may be cut off by a
    crash: a start without its end), and the figures counted directly as the run is drawn."""
    t = rng.uniform(1e9, 2e9)
    counters = {"work": rng.uniform(0, 1e5), "idle": rng.uniform(0, 1e5), "steal": rng.uniform(0, 1e3)}
    origin, first = t, dict(counters)

    def event(name: str, at: float, **fields) -> dict:
        return {"event": name, "t": at, **counters, **fields}

    processes = {"controller": [event("configure", t)]}
    expected = {"workers": {}, "by_file": Counter(), "tests": []}
    for w in range(rng.randint(1, 3)):
        clock = t + rng.uniform(0.1, 3)
        events = [event("configure", clock - 0.05)]
        clock += rng.uniform(0.1, 5)
        events.append(event("collected", clock))
        busy, last_end, spans = 0.0, None, 0
        for _ in range(rng.choice([0, 1, 5, 20])):
            node = f"tests/{rng.choice('abc')}/test_{rng.choice('xyz')}.py::test_{rng.randrange(10**6)}"
            clock += rng.uniform(0, 0.01)
            start = clock
            events.append(event("start", start, id=node))
            clock += rng.expovariate(1.0)
            if rng.random() < 0.1:  # cut off: never ended, counts nowhere
                continue
            events.append(event("end", clock, id=node))
            busy, last_end, spans = busy + clock - start, clock - origin, spans + 1
            expected["by_file"][node.split("::")[0]] += clock - start
            expected["tests"].append((clock - start, node))
        events.append(event("finish", clock + 0.01))
        processes[f"gw{w}"] = events
        expected["workers"][f"gw{w}"] = {
            "collected": events[1]["t"] - origin,
            "busy": busy,
            "last_end": last_end,
            "tests": spans,
        }
        t = max(t, clock)
    end = t + rng.uniform(0.01, 1)
    for key in counters:
        counters[key] += rng.uniform(0, 2 * (end - origin))
    processes["controller"].append(event("finish", end))
    expected["wall"] = end - origin
    expected["cores"] = {k: counters[k] - first[k] for k in counters}
    return processes, expected


@pytest.mark.parametrize("seed", range(20))
def test_the_report_counts_what_the_timelines_hold(seed):
    processes, expected = _random_run(random.Random(seed))
    summary = suite_clock.summarise(processes)
    assert summary["wall"] == pytest.approx(expected["wall"])
    assert summary["workers"].keys() == expected["workers"].keys()
    for name, figures in expected["workers"].items():
        assert summary["workers"][name] == pytest.approx(figures), name
    assert summary["cores"] == pytest.approx(expected["cores"])
    assert dict(summary["by_file"]) == pytest.approx(dict(expected["by_file"]))
    assert summary["tests"] == sorted(expected["tests"], reverse=True)
    assert "wall" in suite_clock.report(summary)


def test_the_cpu_counters_read_proc_stat_in_core_seconds(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice, in clock ticks
    stat.write_text("cpu  1000 20 300 5000 70 8 9 40 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    monkeypatch.setattr(suite_clock, "STAT", stat)
    hertz = os.sysconf("SC_CLK_TCK")
    assert suite_clock.cpu_counters() == pytest.approx(
        {"work": (1000 + 20 + 300 + 8 + 9) / hertz, "idle": (5000 + 70) / hertz, "steal": 40 / hertz}
    )
    monkeypatch.setattr(suite_clock, "STAT", tmp_path / "none")
    assert suite_clock.cpu_counters() == {}


@pytest.mark.e2e  # starts a process
def test_the_script_reports_a_real_two_worker_run(tmp_path):
    """The script runs pytest with its plugin loaded in the controller and in both workers: each
    writes its events, and the report names both workers and counts every test."""
    (tmp_path / "test_sample.py").write_text(
        "import time, pytest\n"
        "@pytest.mark.parametrize('n', range(6))\n"
        "def test_sleeps(n):\n    time.sleep(0.05)\n"
    )
    # without SEMRL_SUITE_CLOCK_DIR (a suite run under the clock has it): the script makes the directory
    env = {k: v for k, v in os.environ.items() if k != suite_clock.DIR_ENV} | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "suite_clock.py"),
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            "-q",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    events = Path(out.stdout.split("events in ", 1)[1].splitlines()[0])
    assert sorted(p.name for p in events.iterdir()) == ["controller.jsonl", "gw0.jsonl", "gw1.jsonl"]
    summary = suite_clock.summarise(suite_clock.read_events(events))
    assert sum(w["tests"] for w in summary["workers"].values()) == 6
    assert all(w["collected"] is not None for w in summary["workers"].values())
    assert summary["by_file"]["test_sample.py"] >= 6 * 0.05
    assert "gw0: collected at" in out.stdout and "gw1: collected at" in out.stdout
    if Path("/proc/stat").exists():
        assert "cores over the run" in out.stdout
        assert json.loads((events / "gw0.jsonl").read_text().splitlines()[0]).keys() >= {"work", "idle"}
