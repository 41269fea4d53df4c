"""Training survives numerical faults and being killed at any moment."""

from __future__ import annotations

import os
import re
import signal

import pytest
import torch
from safetensors.torch import load_file

from semrl.cli import main
from semrl.errors import TrainingError
from semrl.runtime.checkpoint import list_checkpoints, load_trainer_state, verify_checkpoint
from semrl.runtime.trainer import Trainer
from tests.forked import run_semrl
from tests.helpers import read_metrics, tiny_run_config, tiny_run_overrides, write_seven_task


def _weights(ckpt):
    return load_file(ckpt / "model.safetensors")


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_non_finite_updates_are_skipped_then_the_run_stops_with_a_checkpoint(
    digit_model_dir, seven_task, tmp_path, capsys
):
    out = tmp_path / "nan"
    cfg = tiny_run_config(
        digit_model_dir,
        seven_task,
        out,
        "trainer.steps=8",
        "trainer.max_bad_updates=2",
        "logging.save_every=1",
        "logging.keep_last=10",
    )
    trainer = Trainer(cfg)

    def poison(module, inputs, output):  # a numerical fault in the training forward from step 3 on
        return output * float("nan") if module.training and trainer.step >= 2 else output

    hook = trainer.models.model.model.norm.register_forward_hook(poison)
    with pytest.raises(TrainingError, match="trainer.max_bad_updates=2") as err:
        trainer.train()
    assert "--resume" in str(err.value)
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert [m["actor/skipped_updates"] for m in metrics] == [0.0, 0.0, 1.0, 1.0]
    assert not any(torch.isnan(p).any() for p in trainer.models.model.parameters())
    ckpts = list_checkpoints(out)
    assert [c.name for c in ckpts] == [f"step-00000{i}" for i in range(1, 5)]
    assert _same(_weights(ckpts[1]), _weights(ckpts[3]))  # the skipped updates changed nothing
    hook.remove()

    # once the cause is gone, the run goes on from its checkpoint, even past a torn log line
    with (out / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 5, "rew')
    assert main(["train", "--resume", str(out), "logging.progress=false"]) == 0
    assert [m["step"] for m in read_metrics(out)] == list(range(1, 9))
    assert read_metrics(out)[-1]["actor/skipped_updates"] == 0.0
    capsys.readouterr()


KILL_POINTS = ["rollout", "update", "checkpoint"]


def _train_cmd(model_dir, task, out, *extra):
    return [
        "train",
        *tiny_run_overrides(
            model_dir,
            task,
            out,
            "trainer.steps=4",
            "logging.save_every=1",
            "logging.keep_last=2",
            "logging.report_to=[]",
            *extra,
        ),
    ]


def _assert_checkpoints_complete(run_dir):
    for ckpt in list_checkpoints(run_dir):
        names = {p.name for p in ckpt.iterdir()}
        assert {
            "model.safetensors",
            "config.json",
            "trainer_state",
            "manifest.json",
            "tokenizer.json",
        } <= names, ckpt
        assert {"trainer_state.json", "trainer_state.safetensors"} <= {
            p.name for p in (ckpt / "trainer_state").iterdir()
        }
        assert not verify_checkpoint(ckpt), ckpt
        _weights(ckpt)
        load_trainer_state(ckpt)


@pytest.fixture(scope="module")
def uninterrupted_run(digit_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    task = write_seven_task(root / "seven.jsonl")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    assert run_semrl(*_train_cmd(digit_model_dir, task, root / "full"), env=env).returncode == 0
    return task, root / "full", env


@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_at_any_point_then_resume_gives_the_uninterrupted_weights(
    digit_model_dir, uninterrupted_run, tmp_path, point
):
    """A real process is SIGKILLed (by itself, at a named point of step 3, through
    SEMRL_FAULT_KILL) and resumed; the final weights equal an uninterrupted run's exactly."""
    seven_task, full, env = uninterrupted_run
    run = tmp_path / point
    killed = run_semrl(
        *_train_cmd(digit_model_dir, seven_task, run), env={**env, "SEMRL_FAULT_KILL": f"{point}@3"}
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    _assert_checkpoints_complete(run)
    assert [c.name for c in list_checkpoints(run)] == ["step-000001", "step-000002"]
    partial = list((run / "checkpoints").glob(".tmp-*"))
    assert bool(partial) == (point == "checkpoint")  # the half-written one never got a final name

    resumed = run_semrl("train", "--resume", str(run), "logging.progress=false", env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not list((run / "checkpoints").glob(".tmp-*"))
    _assert_checkpoints_complete(run)
    assert _same(
        _weights(full / "checkpoints" / "step-000004"), _weights(run / "checkpoints" / "step-000004")
    )
    assert [m["reward"] for m in read_metrics(full)] == [m["reward"] for m in read_metrics(run)]


def test_a_stalled_engine_stops_the_run_in_its_time_and_keeps_the_last_checkpoint(
    digit_model_dir, uninterrupted_run, tmp_path
):
    """The engine stops making progress in step 3's rollout (SEMRL_FAULT_HANG): the run ends with exit
    code 3 about rollout.stall_timeout_s after the last token, names the engine, the phase and the
    option, keeps the checkpoints of steps 1 and 2, and resumes to the uninterrupted run's weights."""
    seven_task, full, env = uninterrupted_run
    run = tmp_path / "stalled"
    stalled = run_semrl(
        *_train_cmd(digit_model_dir, seven_task, run, "rollout.stall_timeout_s=3"),
        env={**env, "SEMRL_FAULT_HANG": "rollout@3"},
        timeout=120,  # without the watchdog the run waits forever: the test fails here instead
    )
    assert stalled.returncode == 3, stalled.stderr[-2000:]
    message = stalled.stderr.strip().splitlines()[-1]
    match = re.search(
        r"the hf engine made no progress \(no token sampled, no request finished\) for (\d+) s", message
    )
    assert match and 3 <= int(match.group(1)) <= 6, message
    assert "in step 3's rollout, past rollout.stall_timeout_s=3" in message
    assert f"{run / 'checkpoints' / 'step-000002'}, is kept" in message and f"--resume {run}" in message
    _assert_checkpoints_complete(run)
    assert [c.name for c in list_checkpoints(run)] == ["step-000001", "step-000002"]
    resumed = run_semrl("train", "--resume", str(run), "logging.progress=false", env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _same(
        _weights(full / "checkpoints" / "step-000004"), _weights(run / "checkpoints" / "step-000004")
    )


def test_faults_are_read_from_the_environment_once_and_checked_there(monkeypatch):
    """The fault points of a run come from one object built from ``SEMRL_FAULT_*``: a malformed
    variable fails when it is read, not at the point; a disk-full fault fails only its checkpoint."""
    import errno

    from semrl.core.faults import Faults

    monkeypatch.setenv("SEMRL_FAULT_KILL", "rollout@x")
    with pytest.raises(ValueError, match="SEMRL_FAULT_KILL='rollout@x': expected POINT@STEP"):
        Faults.from_env()
    monkeypatch.delenv("SEMRL_FAULT_KILL")
    monkeypatch.setenv("SEMRL_FAULT_SIGNAL", "update@3,evaluate@0")
    monkeypatch.setenv("SEMRL_FAULT_ENOSPC", "2")
    faults = Faults.from_env()
    assert faults.terminate == {("update", 3), ("evaluate", 0)} and faults.kill == frozenset()
    for point, step in [("checkpoint", 1), ("checkpoint", 3), ("update", 2)]:
        faults.at(point, step)  # nothing asked for here
    with pytest.raises(OSError) as err:
        faults.at("checkpoint", 2)
    assert err.value.errno == errno.ENOSPC
    monkeypatch.setenv("SEMRL_FAULT_RANK", "1")  # only rank 1 is signalled; this process is rank 0
    assert Faults.from_env().terminate == frozenset()
