"""Data-parallel training in 2 CPU processes (gloo, through accelerate) equals 1 process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from semrl.checkpoint import load_trainer_state
from semrl.config import ConfigError
from semrl.trainer import Trainer

from .conftest import write_seven_task
from .test_training import _cfg, _metrics


def _args(model_dir, task, out):
    return [
        f"model.name={model_dir}", f"data.train={task}", f"data.eval={task}", "data.eval_size=5",
        "logging.eval_samples=4",
        "data.system_prompt=Answer with one digit.", "rollout.group_size=8", "rollout.prompts_per_step=4",
        "rollout.max_new_tokens=4", "trainer.micro_batch_size=8", "trainer.lr=2e-3", "reward.num_workers=1",
        "trainer.steps=3", "rollout.seed_per_sequence=true", "logging.progress=false",
        "logging.report_to=[]", f"logging.output_dir={out}", "trainer.packing=none",  # padded: the reference
    ]


def _train(*args, env=None):
    run = subprocess.run([sys.executable, "-m", "semrl", "train", *args], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("run finished:") == 1 and "held-out (5 problems)" in run.stdout  # one table, main only


def _final_weights(run_dir, step=3):
    return load_file(run_dir / "checkpoints" / f"step-{step:06d}" / "model.safetensors")


@pytest.fixture(scope="module")
def single_process_run(digit_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    task = write_seven_task(root / "seven.jsonl")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    _train(*_args(digit_model_dir, task, root / "one"), env=env)
    return task, root / "one", env


def _assert_same_training(digit_model_dir, one, other):
    assert [m["step"] for m in _metrics(other)] == [0, 1, 2, 3]  # the main process logs, once per step
    for m in (_metrics(other)[0], _metrics(other)[-1]):  # held-out problems shared out, 5 x 4 samples
        assert 0.0 <= m["eval/mean@4"] <= 1.0 and m["eval/problems"] == 5
    m1, m2 = _metrics(one)[1:], _metrics(other)[1:]
    assert [m["reward"] for m in m1] == [m["reward"] for m in m2]  # the same samples
    for a, b in zip(m1, m2, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-4)
    start = load_file(digit_model_dir / "model.safetensors")
    w1, w2 = _final_weights(one), _final_weights(other)
    assert w1.keys() == w2.keys()
    assert max((w1[k] - start[k]).abs().max().item() for k in w1) > 1e-3  # training moved the weights
    assert all(torch.allclose(w1[k], w2[k], atol=1e-4) for k in w1)  # ... alike in both runs


def test_two_processes_train_like_one(digit_model_dir, single_process_run, tmp_path):
    """Same global batch, same steps: each process takes 2 of the 4 prompt groups, computes its
    share of the loss with the global token count, and gradients are summed over gloo."""
    task, one, env = single_process_run
    two = tmp_path / "two"
    _train("--num-processes", "2", *_args(digit_model_dir, task, two), env=env)
    _assert_same_training(digit_model_dir, one, two)

    # the checkpoint holds one random state per process; resuming needs as many processes
    state = load_trainer_state(two / "checkpoints" / "step-000003")
    assert isinstance(state["rng"], list) and len(state["rng"]) == 2
    with pytest.raises(ConfigError, match="--num-processes 2"):
        Trainer(_cfg(digit_model_dir, task, two, "trainer.steps=4", f"data.eval={task}", "data.eval_size=5"), resume=True)


def test_fsdp_trains_like_one_process_and_resumes_exactly(digit_model_dir, single_process_run, tmp_path):
    """FSDP2 over 2 gloo processes: sharded parameters, gradients and AdamW state give the
    single-process weights; a run stopped after step 2 and resumed ends where an uninterrupted one does."""
    task, one, env = single_process_run
    fsdp, part = tmp_path / "fsdp", tmp_path / "part"
    _train("--num-processes", "2", *_args(digit_model_dir, task, fsdp), "trainer.fsdp=true", env=env)
    _assert_same_training(digit_model_dir, one, fsdp)

    _train("--num-processes", "2", *_args(digit_model_dir, task, part), "trainer.fsdp=true", "trainer.steps=2", env=env)
    _train("--num-processes", "2", "--resume", str(part), "trainer.steps=3", "logging.progress=false", env=env)
    w_full, w_resumed = _final_weights(fsdp), _final_weights(part)
    assert all(torch.equal(w_full[k], w_resumed[k]) for k in w_full)


def test_fsdp_with_tree_packing_trains_like_one_process(digit_model_dir, single_process_run, tmp_path):
    """Packed rows go through the model's own forward, so FSDP's root hooks gather the parameters:
    FSDP with trainer.packing=tree equals the single-process padded run."""
    task, one, env = single_process_run
    packed = tmp_path / "packed"
    _train("--num-processes", "2", *_args(digit_model_dir, task, packed), "trainer.fsdp=true", "trainer.packing=tree",
           env=env)
    _assert_same_training(digit_model_dir, one, packed)


def test_fsdp_mixed_precision_with_a_token_budget(digit_model_dir, single_process_run, tmp_path):
    """FSDP2's bf16 policy over fp32 shards, micro-batches by tokens (rows of unequal lengths on the
    two processes, as many micro-batches on each, or a collective would hang): it trains, and the
    checkpoint holds the fp32 master weights."""
    task, _, env = single_process_run
    out = tmp_path / "bf16"
    run = subprocess.run(
        [sys.executable, "-m", "semrl", "train", "--num-processes", "2", *_args(digit_model_dir, task, out),
         "trainer.fsdp=true", "model.dtype=bfloat16", "trainer.micro_batch_tokens=60"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    weights, start = _final_weights(out), load_file(digit_model_dir / "model.safetensors")
    assert all(w.dtype == torch.float32 for w in weights.values())
    assert max((weights[k] - start[k]).abs().max().item() for k in weights) > 1e-3
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in _metrics(out)[1:])


def test_fsdp_needs_several_processes(digit_model_dir, seven_task, tmp_path):
    with pytest.raises(ConfigError, match="--num-processes"):
        Trainer(_cfg(digit_model_dir, seven_task, tmp_path / "f", "trainer.fsdp=true"))


def test_per_sequence_seeds_make_rollouts_independent_of_the_generation_batch(digit_model_dir, seven_task, tmp_path):
    runs = []
    for batch_size in (32, 5):
        out = tmp_path / f"gb{batch_size}"
        Trainer(_cfg(digit_model_dir, seven_task, out, "trainer.steps=2", "rollout.seed_per_sequence=true",
                     f"rollout.generation_batch_size={batch_size}")).train()
        runs.append([m["reward"] for m in _metrics(out)])
    assert runs[0] == runs[1]


def test_a_bad_config_fails_before_any_process_starts(capsys):
    from semrl.cli import main

    assert main(["train", "--num-processes", "2", "trainer.stpes=3"]) == 2
    assert "trainer.steps" in capsys.readouterr().err


def test_lora_on_two_processes_trains_like_one(digit_model_dir, single_process_run, tmp_path):
    """model.lora_r without FSDP: every process holds the frozen base, adapter gradients are summed."""
    task, _, env = single_process_run
    lora = ["model.lora_r=8", "algorithm.kl_coef=0.01"]  # the KL's reference: the base, adapters off
    one, two = tmp_path / "one", tmp_path / "two"
    _train(*_args(digit_model_dir, task, one), *lora, env=env)
    _train("--num-processes", "2", *_args(digit_model_dir, task, two), *lora, env=env)
    m1, m2 = _metrics(one)[1:], _metrics(two)[1:]
    assert [m["reward"] for m in m1] == [m["reward"] for m in m2]
    for a, b in zip(m1, m2, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["kl"] == pytest.approx(b["kl"], abs=1e-7)
    a1, a2 = (load_file(run / "checkpoints" / "step-000003" / "adapter_model.safetensors") for run in (one, two))
    assert a1.keys() == a2.keys() and max(v.abs().max().item() for k, v in a1.items() if "lora_B" in k) > 1e-3
    assert all(torch.allclose(a1[k], a2[k], atol=1e-5) for k in a1)
