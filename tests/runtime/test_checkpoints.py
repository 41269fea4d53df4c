"""Checkpoints that are damaged, old or hostile: manifest verification, fallback on --resume,
trainer state without pickle."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest
import torch

from semrl.cli import main
from semrl.core.safe_state import STATE_JSON, STATE_TENSORS, load_state, save_state
from semrl.runtime.checkpoint import (
    LEGACY_STATE,
    MANIFEST,
    STATE_DIR,
    rng_state,
    trainer_state_dir,
    verify_checkpoint,
)
from semrl.runtime.trainer import Trainer
from tests.forked import run_semrl
from tests.helpers import final_weights, tiny_run_config, write_seven_task


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return type(a) is type(b) and a == b


def test_trainer_state_round_trips_without_pickle(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: 1.0)
    state = {
        "step": 3,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "stage": 1,
        "rng": [rng_state(torch.Generator().manual_seed(1)), rng_state(torch.Generator().manual_seed(2))],
        "nested": {"__odd": (1, 2.5, None, "x"), 7: [True]},
    }
    save_state(state, tmp_path)
    assert _equal(state, load_state(tmp_path))
    with pytest.raises(TypeError, match="cannot be stored without pickle"):
        save_state({"f": lambda: 0}, tmp_path)


def _cfg(model_dir, task, out, *extra):
    """The tiny run, 3 steps, a checkpoint after each."""
    return tiny_run_config(
        model_dir,
        task,
        out,
        "trainer.steps=3",
        "logging.save_every=1",
        "logging.keep_last=3",
        "logging.report_to=[]",
        *extra,
    )


@pytest.fixture(scope="module")
def three_steps(digit_model_dir, tmp_path_factory):
    """The run, made once for the module's tests: those that damage it copy it first."""
    root = tmp_path_factory.mktemp("checkpoints")
    full = root / "full"
    Trainer(_cfg(digit_model_dir, write_seven_task(root / "seven.jsonl"), full)).train()
    return full


def _damage(ckpt, how):
    model = ckpt / "model.safetensors"
    if how == "truncate":
        model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    elif how == "delete":
        (trainer_state_dir(ckpt) / STATE_JSON).unlink()
    elif how == "bitflip":
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0x10
        model.write_bytes(bytes(data))
    elif how == "no-manifest":
        (ckpt / MANIFEST).unlink()


@pytest.mark.parametrize("how", ["truncate", "delete", "bitflip", "no-manifest"])
def test_resume_skips_a_damaged_newest_checkpoint(three_steps, tmp_path, how):
    run = tmp_path / "run"
    shutil.copytree(three_steps, run)
    _damage(run / "checkpoints" / "step-000003", how)
    assert verify_checkpoint(run / "checkpoints" / "step-000003")
    proc = run_semrl("train", "--resume", str(run))
    assert proc.returncode == 0, proc.stderr[-2000:]
    reason = {
        "truncate": "model.safetensors has",
        "delete": "trainer_state.json is missing",
        "bitflip": "does not match its checksum",
        "no-manifest": "manifest.json is missing",
    }[how]
    assert "skipping checkpoint" in proc.stderr and "step-000003" in proc.stderr and reason in proc.stderr
    assert not verify_checkpoint(run / "checkpoints" / "step-000003")  # rewritten from step 2
    a, b = final_weights(three_steps, 3), final_weights(run, 3)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_no_valid_checkpoint_is_a_clear_error(three_steps, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(three_steps, run)
    for step in (1, 2, 3):
        _damage(run / "checkpoints" / f"step-{step:06d}", "truncate")
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "no valid checkpoint" in err and "step-000001: model.safetensors has" in err


def test_checkpoint_verify_reports_each_checkpoint(three_steps, tmp_path, capsys):
    assert main(["checkpoint", "verify", str(three_steps)]) == 0
    assert "3 of 3 checkpoints valid" in capsys.readouterr().out
    run = tmp_path / "run"
    shutil.copytree(three_steps, run)
    _damage(run / "checkpoints" / "step-000002", "bitflip")
    assert main(["checkpoint", "verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert "step-000002: DAMAGED" in out and "2 of 3 checkpoints valid" in out


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_in_a_checkpoint_never_runs(three_steps, tmp_path, capsys):
    marker = tmp_path / "pwned"
    run = tmp_path / "run"
    shutil.copytree(three_steps, run)
    ckpt = run / "checkpoints" / "step-000003"
    # an old-style checkpoint whose trainer_state.pt would run a command when unpickled
    shutil.rmtree(ckpt / STATE_DIR)
    (ckpt / MANIFEST).unlink()
    (ckpt / LEGACY_STATE).write_bytes(pickle.dumps({"step": 3, "x": _Payload(marker)}))
    for older in ("step-000001", "step-000002"):
        shutil.rmtree(run / "checkpoints" / older)
    assert main(["train", "--resume", str(run)]) == 2
    assert "written by semrl 0.1" in capsys.readouterr().err
    # beside a valid checkpoint it is never read either
    good = tmp_path / "good"
    shutil.copytree(three_steps, good)
    (good / "checkpoints" / "step-000003" / LEGACY_STATE).write_bytes(pickle.dumps(_Payload(marker)))
    assert main(["train", "--resume", str(good)]) == 0
    assert not marker.exists()


def test_a_checkpoint_holds_only_weights_beside_its_config(three_steps, tmp_path):
    """Inference engines (vLLM, SGLang, ``vllm serve``) load every *.safetensors beside config.json:
    the optimizer state lives in trainer_state/, so the directory loads as it is, and no engine
    needs to know the checkpoint's other files."""
    ckpt = three_steps / "checkpoints" / "step-000003"
    assert sorted(p.name for p in ckpt.glob("*.safetensors")) == ["model.safetensors"]
    assert (ckpt / STATE_DIR / STATE_JSON).is_file() and (ckpt / STATE_DIR / STATE_TENSORS).is_file()
    assert (
        not verify_checkpoint(ckpt)
        and "trainer_state/trainer_state.safetensors" in (ckpt / MANIFEST).read_text()
    )
