"""Preemption and a full disk, with real `semrl train` processes: SIGTERM during the rollout, the
update or the evaluation stops after that step with a checkpoint and exit code 75, and --resume
ends bit-identical to the run that was never stopped; Ctrl-C while loading stops at once with one
line (exit 130), during the base evaluation or a step as SIGTERM does; a second signal exits at once; ENOSPC while
writing a checkpoint leaves the previous one intact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from semrl.runtime.checkpoint import list_checkpoints, verify_checkpoint
from semrl.runtime.preemption import EXIT_PREEMPTED
from tests.forked import run_semrl
from tests.helpers import final_weights, tiny_run_overrides


def _args(model_dir, task, out):
    return tiny_run_overrides(
        model_dir,
        task,
        out,
        f"data.eval={task}",
        "data.eval_size=4",
        "logging.eval_samples=2",
        "logging.eval_every=1",
        "trainer.steps=3",
        "logging.report_to=[]",
    )


def _train(*args, env=None):
    """``python -m semrl train *args``, forked from the test worker's preloaded server (tests.forked)."""
    return run_semrl("train", *args, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def uninterrupted(digit_model_dir, tmp_path_factory):
    from tests.helpers import write_seven_task

    root = tmp_path_factory.mktemp("preempt")
    task = write_seven_task(root / "seven.jsonl")
    out = root / "full"
    proc = _train(*_args(digit_model_dir, task, out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return task, out


@pytest.mark.parametrize("point", ["rollout", "update", "evaluate"])
def test_sigterm_stops_after_the_step_and_resume_is_exact(uninterrupted, digit_model_dir, tmp_path, point):
    task, full = uninterrupted
    run = tmp_path / "run"
    proc = _train(*_args(digit_model_dir, task, run), env={"SEMRL_FAULT_SIGNAL": f"{point}@2"})
    assert proc.returncode == EXIT_PREEMPTED, proc.stderr[-2000:]
    assert "SIGTERM received: stopped after step 2" in proc.stderr and "--resume" in proc.stderr
    assert [c.name for c in list_checkpoints(run)] == ["step-000002"]
    assert not verify_checkpoint(run / "checkpoints" / "step-000002")
    proc = _train("--resume", str(run))
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = final_weights(full), final_weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)


def _as_a_terminal_starts_it(blocked: bool):  # noqa: ANN202
    """The child's signal state before exec: Ctrl-C at its default, as a terminal's foreground job has
    it (a test runner started in the background, ``cmd &`` in a script, ignores SIGINT, and an ignored
    signal stays ignored across exec and in semrl: the caller's choice); ``blocked``: SIGINT and
    SIGTERM blocked too, as a child of a process (or a test runner's worker) that blocked them."""

    def setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

    return setup


def _ctrl_c(*args, at, blocked=False):
    """``semrl train`` in a session of its own, sent Ctrl-C (SIGINT to its process group) at ``at``;
    ``blocked``: started with SIGINT and SIGTERM blocked (``_as_a_terminal_starts_it``)."""
    return subprocess.run(
        [sys.executable, "-m", "semrl", "train", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "SEMRL_FAULT_CTRL_C": at},
        timeout=600,
        start_new_session=True,
        preexec_fn=_as_a_terminal_starts_it(blocked),
    )


def test_ctrl_c_while_loading_stops_at_once_with_one_line(uninterrupted, digit_model_dir, tmp_path):
    task, _ = uninterrupted
    run = tmp_path / "run"
    # started with the signals blocked: without semrl unblocking them, Ctrl-C would stay pending
    # and the run would train to the end (exit 0)
    # with TensorBoard on (the default tracker), whose writer has made its folder by then
    proc = _ctrl_c(
        *_args(digit_model_dir, task, run), "logging.report_to=[tensorboard]", at="load@0", blocked=True
    )
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert (
        f"semrl: interrupted while loading, before step 1: nothing was trained and the new run directory {run} is removed"
        in proc.stderr
    )
    assert not run.exists()  # so the same command starts again, and a time-stamped directory leaves no trace


def test_ctrl_c_in_the_base_evaluation_keeps_it_and_resume_is_exact(uninterrupted, digit_model_dir, tmp_path):
    task, full = uninterrupted
    run = tmp_path / "run"
    proc = _ctrl_c(*_args(digit_model_dir, task, run), at="evaluate@0")
    assert proc.returncode == EXIT_PREEMPTED, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "SIGINT received: stopped after the base evaluation, before step 1," in proc.stderr
    assert [c.name for c in list_checkpoints(run)] == ["step-000000"]
    base = (run / "metrics.jsonl").read_text()
    proc = _train("--resume", str(run))
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the base evaluation is not run twice: the log is the uninterrupted run's, less its timings
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3] and (run / "metrics.jsonl").read_text().startswith(base)
    a, b = final_weights(full), final_weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_during_a_step_finishes_it_without_a_traceback(uninterrupted, digit_model_dir, tmp_path):
    task, _ = uninterrupted
    run = tmp_path / "run"
    proc = _ctrl_c(*_args(digit_model_dir, task, run), at="rollout@2")
    assert proc.returncode == EXIT_PREEMPTED, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "SIGINT received: stopped after step 2" in proc.stderr
    assert [c.name for c in list_checkpoints(run)] == ["step-000002"]


def test_a_second_signal_exits_at_once(uninterrupted, digit_model_dir, tmp_path):
    task, _ = uninterrupted
    run = tmp_path / "run"
    proc = _train(*_args(digit_model_dir, task, run), env={"SEMRL_FAULT_SIGNAL": "rollout@2,update@2"})
    assert proc.returncode == 128 + 15, proc.stderr[-2000:]
    assert list_checkpoints(run) == []  # nothing half-written; the step was abandoned


def test_a_full_disk_keeps_the_previous_checkpoint(uninterrupted, digit_model_dir, tmp_path):
    task, full = uninterrupted
    run = tmp_path / "run"
    proc = _train(*_args(digit_model_dir, task, run), "logging.save_every=1", env={"SEMRL_FAULT_ENOSPC": "2"})
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "no space left on the device while writing the checkpoint of step 2" in proc.stderr
    assert "GiB are free" in proc.stderr and "step-000001 is intact" in proc.stderr
    assert [c.name for c in list_checkpoints(run)] == ["step-000001"]
    assert not verify_checkpoint(run / "checkpoints" / "step-000001")
    assert not list((run / "checkpoints").glob(".tmp-*"))
    proc = _train("--resume", str(run))
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = final_weights(full), final_weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_processes_agree_to_stop_when_one_is_signalled(uninterrupted, digit_model_dir, tmp_path):
    """Two processes, only rank 1 gets SIGTERM during step 2's rollout: both stop after step 2 with
    one checkpoint, and resuming with two processes ends as the two-process run never stopped."""
    task, _ = uninterrupted
    env = {"OMP_NUM_THREADS": "1"}
    full, run = tmp_path / "full", tmp_path / "run"
    proc = _train(
        "--num-processes", "2", *_args(digit_model_dir, task, full), "rollout.seed_per_sequence=true", env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _train(
        "--num-processes",
        "2",
        *_args(digit_model_dir, task, run),
        "rollout.seed_per_sequence=true",
        env={**env, "SEMRL_FAULT_SIGNAL": "rollout@2", "SEMRL_FAULT_RANK": "1"},
    )
    assert proc.returncode != 0 and proc.stderr.count("stopped after step 2") == 2, proc.stderr[-3000:]
    assert [c.name for c in list_checkpoints(run)] == ["step-000002"]
    proc = _train("--num-processes", "2", "--resume", str(run), env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = final_weights(full), final_weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)
