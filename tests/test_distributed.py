"""Data-parallel training in 2 CPU processes (gloo, through accelerate) equals 1 process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from semrl.config import ConfigError
from semrl.trainer import Trainer

from .test_training import _cfg, _metrics


def _args(model_dir, task, out):
    return [
        f"model.name={model_dir}", f"data.train={task}", "data.eval=null",
        "data.system_prompt=Answer with one digit.", "rollout.group_size=8", "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=4", "trainer.micro_batch_size=8", "trainer.lr=2e-3", "reward.num_workers=1",
        "trainer.steps=3", "rollout.seed_per_sequence=true", "logging.progress=false",
        "logging.tensorboard=false", f"logging.output_dir={out}",
    ]


def test_two_processes_train_like_one(digit_model_dir, seven_task, tmp_path):
    """Same global batch, same steps: each process takes 2 of the 4 prompt groups, computes its
    share of the loss with the global token count, and gradients are summed over gloo."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one, two = tmp_path / "one", tmp_path / "two"
    single = subprocess.run(
        [sys.executable, "-m", "semrl", "train", *_args(digit_model_dir, seven_task, one)],
        env=env, capture_output=True, text=True,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    double = subprocess.run(
        [sys.executable, "-m", "semrl", "train", "--num-processes", "2", *_args(digit_model_dir, seven_task, two)],
        env=env, capture_output=True, text=True,
    )
    assert double.returncode == 0, double.stderr[-3000:]

    m1, m2 = _metrics(one), _metrics(two)
    assert [m["step"] for m in m2] == [1, 2, 3]  # the main process logs, once per step
    assert [m["reward"] for m in m1] == [m["reward"] for m in m2]  # the same samples
    for a, b in zip(m1, m2, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-4)

    start = load_file(digit_model_dir / "model.safetensors")
    w1 = load_file(one / "checkpoints" / "step-000003" / "model.safetensors")
    w2 = load_file(two / "checkpoints" / "step-000003" / "model.safetensors")
    moved = max((w1[k] - start[k]).abs().max().item() for k in w1)
    apart = max((w1[k] - w2[k]).abs().max().item() for k in w1)
    assert moved > 1e-3  # training changed the weights ...
    assert apart < 1e-4 * max(1.0, moved / 1e-3)  # ... and both runs changed them alike
    assert all(torch.allclose(w1[k], w2[k], atol=1e-4) for k in w1)

    # the checkpoint holds one random state per process; resuming needs as many processes
    state = torch.load(two / "checkpoints" / "step-000003" / "trainer_state.pt", weights_only=False)
    assert isinstance(state["rng"], list) and len(state["rng"]) == 2
    with pytest.raises(ConfigError, match="--num-processes 2"):
        Trainer(_cfg(digit_model_dir, seven_task, two, "trainer.steps=4", "rollout.seed_per_sequence=true"),
                resume=True)


def test_per_sequence_seeds_make_rollouts_independent_of_the_generation_batch(digit_model_dir, seven_task, tmp_path):
    runs = []
    for batch_size in (32, 5):
        out = tmp_path / f"gb{batch_size}"
        Trainer(_cfg(digit_model_dir, seven_task, out, "trainer.steps=2", "rollout.seed_per_sequence=true",
                     f"rollout.generation_batch_size={batch_size}")).train()
        runs.append([m["reward"] for m in _metrics(out)])
    assert runs[0] == runs[1]
