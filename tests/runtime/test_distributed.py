"""Data-parallel training in 2 CPU processes (gloo, through accelerate) equals 1 process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from semrl.config.sections import ConfigError
from semrl.runtime.checkpoint import load_trainer_state
from semrl.runtime.trainer import Trainer
from tests.helpers import (
    distributed_run_overrides,
    final_weights,
    read_metrics,
    tiny_run_config,
    train_in_subprocess,
    write_seven_task,
)


@pytest.fixture(scope="module")
def single_process_run(digit_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    task = write_seven_task(root / "seven.jsonl")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    train_in_subprocess(*distributed_run_overrides(digit_model_dir, task, root / "one"), env=env)
    return task, root / "one", env


def _assert_same_training(digit_model_dir, one, other):
    assert [m["step"] for m in read_metrics(other)] == [0, 1, 2, 3]  # the main process logs, once per step
    for m in (read_metrics(other)[0], read_metrics(other)[-1]):  # held-out problems shared out, 5 x 4 samples
        assert 0.0 <= m["eval/mean@4"] <= 1.0 and m["eval/problems"] == 5
    m1, m2 = read_metrics(one)[1:], read_metrics(other)[1:]
    assert [m["reward"] for m in m1] == [m["reward"] for m in m2]  # the same samples
    for a, b in zip(m1, m2, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-4)
    start = load_file(digit_model_dir / "model.safetensors")
    w1, w2 = final_weights(one), final_weights(other)
    assert w1.keys() == w2.keys()
    assert max((w1[k] - start[k]).abs().max().item() for k in w1) > 1e-3  # training moved the weights
    assert all(torch.allclose(w1[k], w2[k], atol=1e-4) for k in w1)  # ... alike in both runs


def test_two_processes_train_like_one(digit_model_dir, single_process_run, tmp_path):
    """Same global batch, same steps: each process takes 2 of the 4 prompt groups, computes its
    share of the loss with the global token count, and gradients are summed over gloo."""
    task, one, env = single_process_run
    two = tmp_path / "two"
    train_in_subprocess(  # the real `accelerate launch`; the other tests fork their ranks (tests.forked)
        "--num-processes", "2", *distributed_run_overrides(digit_model_dir, task, two), env=env, launch=True
    )
    _assert_same_training(digit_model_dir, one, two)

    # the checkpoint holds one random state per process; resuming needs as many processes
    state = load_trainer_state(two / "checkpoints" / "step-000003")
    assert isinstance(state["rng"], list) and len(state["rng"]) == 2
    with pytest.raises(ConfigError, match="--num-processes 2"):
        Trainer(
            tiny_run_config(
                digit_model_dir, task, two, "trainer.steps=4", f"data.eval={task}", "data.eval_size=5"
            ),
            resume=True,
        )


def test_fsdp_trains_like_one_process_and_resumes_exactly(digit_model_dir, single_process_run, tmp_path):
    """FSDP2 over 2 gloo processes: sharded parameters, gradients and AdamW state give the
    single-process weights; a run stopped after step 2 and resumed ends where an uninterrupted one does."""
    task, one, env = single_process_run
    fsdp, part = tmp_path / "fsdp", tmp_path / "part"
    train_in_subprocess(
        "--num-processes",
        "2",
        *distributed_run_overrides(digit_model_dir, task, fsdp),
        "trainer.fsdp=true",
        env=env,
    )
    _assert_same_training(digit_model_dir, one, fsdp)

    train_in_subprocess(
        "--num-processes",
        "2",
        *distributed_run_overrides(digit_model_dir, task, part),
        "trainer.fsdp=true",
        "trainer.steps=2",
        env=env,
    )
    train_in_subprocess(
        "--num-processes", "2", "--resume", str(part), "trainer.steps=3", "logging.progress=false", env=env
    )
    w_full, w_resumed = final_weights(fsdp), final_weights(part)
    assert all(torch.equal(w_full[k], w_resumed[k]) for k in w_full)


def test_fsdp_with_tree_packing_trains_like_one_process(digit_model_dir, single_process_run, tmp_path):
    """Packed rows go through the model's own forward, so FSDP's root hooks gather the parameters:
    FSDP with trainer.packing=tree equals the single-process padded run."""
    task, one, env = single_process_run
    packed = tmp_path / "packed"
    train_in_subprocess(
        "--num-processes",
        "2",
        *distributed_run_overrides(digit_model_dir, task, packed),
        "trainer.fsdp=true",
        "trainer.packing=tree",
        env=env,
    )
    _assert_same_training(digit_model_dir, one, packed)


def test_fsdp_curriculum_stage_reference_matches_one_process(digit_model_dir, single_process_run, tmp_path):
    """A SENT curriculum stage restarts the optimizer and takes the trained weights as the KL reference:
    under FSDP every process streams them into its reference one gathered parameter at a time, while
    the checkpoints' gather lands on the main process only. Two FSDP processes train like one, and the
    stage reference on disk holds the stage-1 weights."""
    import json

    task, _, env = single_process_run
    curriculum = tmp_path / "curriculum.jsonl"
    rows = [
        {"id": f"c{i}", "problem": f"Choose a digit ({i}).", "answer": "7", "semantic_entropy": float(i % 5)}
        for i in range(40)
    ]
    curriculum.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sent = [
        f"data.curriculum={curriculum}",
        "algorithm.method=sent",
        "algorithm.kl_coef=0.05",
        "trainer.steps=4",
    ]
    one, fsdp = tmp_path / "one", tmp_path / "fsdp"
    train_in_subprocess(*distributed_run_overrides(digit_model_dir, task, one), *sent, env=env)
    train_in_subprocess(
        "--num-processes",
        "2",
        *distributed_run_overrides(digit_model_dir, task, fsdp),
        *sent,
        "trainer.fsdp=true",
        "logging.save_every=1",
        "logging.keep_last=4",
        env=env,
    )
    m1, m2 = read_metrics(one)[1:], read_metrics(fsdp)[1:]
    assert [m["curriculum/stage"] for m in m2] == [1, 1, 2, 2]
    assert [m["reward"] for m in m1] == [m["reward"] for m in m2]
    for a, b in zip(m1, m2, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    assert m2[-1]["kl"] > 0  # stage 2 reads its new reference
    for run_dir in (one, fsdp):
        final = final_weights(run_dir, step=4)
        reference = load_file(
            run_dir / "curriculum" / "stage-1" / "checkpoints" / "step-000002" / "model.safetensors"
        )
        stage_one = final_weights(run_dir, step=2)
        assert all(torch.equal(reference[k], stage_one[k]) for k in reference)
        assert max((final[k] - stage_one[k]).abs().max().item() for k in final) > 1e-4
    w1, w2 = final_weights(one, step=4), final_weights(fsdp, step=4)
    # AdamW divides by sqrt(v): where a gradient is near 0, the reduction order of FSDP's
    # reduce-scatter moves an element by up to ~lr (2e-3); 1.3e-4 was measured on one 2-core CPU
    assert all(torch.allclose(w1[k], w2[k], atol=5e-4) for k in w1)
    # resumed in stage 2: the sharded reference is loaded from the stage's saved weights
    import shutil

    part = tmp_path / "part"
    shutil.copytree(fsdp, part)
    shutil.rmtree(part / "checkpoints" / "step-000004")  # as if stopped after step 3, in stage 2
    train_in_subprocess("--num-processes", "2", "--resume", str(part), "logging.progress=false", env=env)
    assert [m["loss"] for m in read_metrics(part)[1:]] == pytest.approx([m["loss"] for m in m2], abs=1e-6)
    w3 = final_weights(part, step=4)
    assert all(torch.allclose(w2[k], w3[k], atol=1e-5) for k in w2)


_SHARD_ORDER_SCRIPT = """
import os, sys
import torch, torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from semrl.cli.train import free_port
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from semrl.config.load import load_config
from semrl.core.distributed import ProcessGroup
from semrl.runtime.setup import load_models
moves = []
original_to = torch.nn.Module.to
def recording_to(self, *args, **kwargs):
    if any(p.requires_grad for p in self.parameters()) and hasattr(self, "config"):
        moves.append(isinstance(self, FSDPModule))
    return original_to(self, *args, **kwargs)
torch.nn.Module.to = recording_to
model_dir, fsdp = sys.argv[1], sys.argv[2]
cfg = load_config(None, [f"model.name={model_dir}", f"trainer.fsdp={fsdp}", "reward.num_workers=1",
                         "algorithm.kl_coef=0.01", "model.dtype=float32"])
models = load_models(cfg, model_dir, ProcessGroup(cpu=True), needs_reference=True)
print("SHARDED", isinstance(models.model, FSDPModule), "REF", isinstance(models.ref_model, FSDPModule), "MOVES", moves)
dist.destroy_process_group()  # a gloo group alive at exit can abort the process (docs/reliability.md)
"""


_EXIT_SCRIPT = """
import atexit, os, sys
import torch, torch.distributed as dist
rank, port = sys.argv[1], sys.argv[2]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=rank, LOCAL_RANK=rank, WORLD_SIZE="2")
dist.init_process_group("gloo")
# atexit runs its handlers last in, first out: this one runs after the one ProcessGroup registers
atexit.register(lambda: print("GROUP ALIVE AT EXIT", dist.is_initialized(), flush=True))
from semrl.core.distributed import ProcessGroup
group = ProcessGroup(cpu=True)
assert group.world == 2
dist.all_reduce(torch.ones(1))
raise SystemExit(3)  # an exit without close(), as an error path takes
"""


@pytest.mark.e2e  # starts a process
def test_a_process_that_exits_without_closing_destroys_its_process_group():
    """A gloo group alive when the interpreter finalises can abort the process in C++ ("terminate
    called without an active exception", seen once under load): ProcessGroup destroys it at exit."""
    from semrl.cli.train import free_port

    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _EXIT_SCRIPT, str(rank), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 3, err[-3000:]
        assert "GROUP ALIVE AT EXIT False" in out, out[-500:]


def test_fsdp_shards_the_model_before_it_reaches_the_device(digit_model_dir):
    """Under FSDP the trained model is sharded from its CPU copy (``fully_shard`` moves one layer at a
    time): it is never moved to the device whole, as it is without FSDP; the reference is sharded too."""
    from tests.forked import run_python

    for fsdp, expected in (
        ("true", "SHARDED True REF True MOVES []"),
        ("false", "SHARDED False REF False MOVES [False]"),
    ):
        run = run_python(_SHARD_ORDER_SCRIPT, str(digit_model_dir), fsdp, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        assert expected in run.stdout, (fsdp, run.stdout[-500:])


def test_fsdp_mixed_precision_with_a_token_budget(digit_model_dir, single_process_run, tmp_path):
    """FSDP2's bf16 policy over fp32 shards, micro-batches by tokens (rows of unequal lengths on the
    two processes, as many micro-batches on each, or a collective would hang): it trains, and the
    checkpoint holds the fp32 master weights."""
    task, _, env = single_process_run
    out = tmp_path / "bf16"
    train_in_subprocess(
        "--num-processes",
        "2",
        *distributed_run_overrides(digit_model_dir, task, out),
        "trainer.fsdp=true",
        "model.dtype=bfloat16",
        "trainer.micro_batch_tokens=60",
        env=env,
    )
    weights, start = final_weights(out), load_file(digit_model_dir / "model.safetensors")
    assert all(w.dtype == torch.float32 for w in weights.values())
    assert max((weights[k] - start[k]).abs().max().item() for k in weights) > 1e-3
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in read_metrics(out)[1:])


def test_fsdp_needs_several_processes(digit_model_dir, seven_task, tmp_path):
    with pytest.raises(ConfigError, match="--num-processes"):
        Trainer(tiny_run_config(digit_model_dir, seven_task, tmp_path / "f", "trainer.fsdp=true"))


def test_per_sequence_seeds_make_rollouts_independent_of_the_generation_batch(
    digit_model_dir, seven_task, tmp_path
):
    runs = []
    for batch_size in (32, 5):
        out = tmp_path / f"gb{batch_size}"
        Trainer(
            tiny_run_config(
                digit_model_dir,
                seven_task,
                out,
                "trainer.steps=2",
                "rollout.seed_per_sequence=true",
                f"rollout.generation_batch_size={batch_size}",
            )
        ).train()
        runs.append([m["reward"] for m in read_metrics(out)])
    assert runs[0] == runs[1]


def test_a_bad_config_fails_before_any_process_starts(capsys):
    from semrl.cli import main

    assert main(["train", "--num-processes", "2", "trainer.stpes=3"]) == 2
    assert "trainer.steps" in capsys.readouterr().err


def test_each_launch_takes_a_free_port_unless_master_port_is_set(monkeypatch):
    """Two `semrl train --num-processes N` on one machine do not both take torch's 29500."""
    import socket

    from semrl.cli import main

    launched = []
    monkeypatch.setattr(subprocess, "call", lambda command: launched.append(command) or 0)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        for _ in range(3):
            assert main(["train", "--num-processes", "2", "--config", "configs/demo.yaml"]) == 0
    ports = [int(c[c.index("--main_process_port") + 1]) for c in launched]
    assert taken not in ports and 29500 not in ports and all(p > 0 for p in ports)
    monkeypatch.setenv("MASTER_PORT", "31234")
    assert main(["train", "--num-processes", "2", "--config", "configs/demo.yaml"]) == 0
    assert launched[-1][launched[-1].index("--main_process_port") + 1] == "31234"


def test_lora_on_two_processes_trains_like_one(digit_model_dir, single_process_run, tmp_path):
    """model.lora_r without FSDP: every process holds the frozen base, adapter gradients are summed."""
    task, _, env = single_process_run
    lora = ["model.lora_r=8", "algorithm.kl_coef=0.01"]  # the KL's reference: the base, adapters off
    one, two = tmp_path / "one", tmp_path / "two"
    train_in_subprocess(*distributed_run_overrides(digit_model_dir, task, one), *lora, env=env)
    train_in_subprocess(
        "--num-processes", "2", *distributed_run_overrides(digit_model_dir, task, two), *lora, env=env
    )
    m1, m2 = read_metrics(one)[1:], read_metrics(two)[1:]
    assert [m["reward"] for m in m1] == [m["reward"] for m in m2]
    for a, b in zip(m1, m2, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["kl"] == pytest.approx(b["kl"], abs=1e-7)
    a1, a2 = (
        load_file(run / "checkpoints" / "step-000003" / "adapter_model.safetensors") for run in (one, two)
    )
    assert a1.keys() == a2.keys() and max(v.abs().max().item() for k, v in a1.items() if "lora_B" in k) > 1e-3
    assert all(torch.allclose(a1[k], a2[k], atol=1e-5) for k in a1)
