"""--resume is bit-exact for every method: a run that stops after step 2 and resumes ends with the
same weights and the same per-step metrics as the run that never stopped."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from semrl.cli import main
from semrl.runtime.trainer import Trainer
from tests.helpers import every_method, final_weights, tiny_run_config

# every registered method (every_method adds one these do not name, with its defaults), and variants
METHODS = every_method(
    {
        "dr_grpo": [],
        "rose": [
            "algorithm.method=rose",
            "rollout.max_new_tokens=6",
            "trainer.packing=tree",
            "trainer.lr=5e-3",
        ],
        "sent": [
            "algorithm.method=sent",
            "trainer.ppo_epochs=2",
            "data.curriculum_stages=2",
            "sent.kl_target=ref_k3",
        ],
        "fr3e": ["algorithm.method=fr3e", "rollout.max_new_tokens=6", "fr3e.num_anchors=2"],
        "dapo": [
            "algorithm.method=dapo",
            "algorithm.dynamic_sampling=true",
            "reward.overlong_buffer_len=2",
            "algorithm.max_sampling_rounds=3",
        ],
        "seed_grpo": ["algorithm.method=seed_grpo"],
        "kl_cov": ["algorithm.method=kl_cov", "trainer.ppo_epochs=2", "kl_cov.ratio=0.1"],
        "clip_cov": [
            "algorithm.method=clip_cov",
            "trainer.ppo_epochs=2",
            "clip_cov.ratio=0.1",
            "clip_cov.lb=-1",
        ],
        "entropy_8020": ["algorithm.method=entropy_8020"],
        "treepo": [
            "algorithm.method=treepo",
            "rollout.max_new_tokens=6",
            "treepo.segment_length=2",
            "trainer.packing=tree",
            "algorithm.dynamic_sampling=true",
            "algorithm.dynamic_sampling_metric=accuracy",
            "trainer.lr=5e-3",
        ],
        # eta changes at step 3, after the resume: the rollout reads the step from the restored run
        "latr": [
            "algorithm.method=latr",
            "rollout.max_new_tokens=6",
            "latr.lookahead=[2]",
            "latr.tau_abs=0.02",
            "latr.tau_rel=0.9",
            "latr.eta_steps=[0,3]",
            "latr.eta_values=[1.0,0.5]",
            "trainer.packing=tree",
        ],
        # the adaptive coefficient moves every optimizer step: its state is in the checkpoint
        "entropy_bonus": [
            "algorithm.entropy_coeff=0.02",
            "algorithm.entropy_target=1.0",
            "algorithm.entropy_coeff_delta=0.01",
            "trainer.mini_batch_size=16",
        ],
    }
)


def _rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and "time_frac" not in k} for r in rows]


@pytest.mark.parametrize("method", list(METHODS))
def test_resume_is_exact_for_every_method(method, digit_model_dir, seven_task, tmp_path):
    extra = list(METHODS[method])
    if method == "sent":  # a curriculum whose stage switch falls at the step the run resumes from
        rows = [json.loads(line) for line in seven_task.read_text().splitlines()]
        curriculum = tmp_path / "curriculum.jsonl"
        curriculum.write_text(
            "".join(
                json.dumps({**r, "semantic_entropy": (i * 7) % 11 / 10}) + "\n" for i, r in enumerate(rows)
            )
        )
        extra.append(f"data.curriculum={curriculum}")
    full = tmp_path / "full"
    cfg = tiny_run_config(
        digit_model_dir,
        seven_task,
        full,
        "trainer.steps=4",
        "logging.save_every=1",
        "logging.keep_last=4",
        "logging.report_to=[]",
        *extra,
    )
    Trainer(cfg).train()
    part = tmp_path / "part"  # the same run, stopped after its step-2 checkpoint
    shutil.copytree(full, part)
    for step in (3, 4):
        shutil.rmtree(part / "checkpoints" / f"step-{step:06d}")
    assert main(["train", "--resume", str(part)]) == 0
    a = final_weights(full, 4)
    b = final_weights(part, 4)
    initial = load_file(digit_model_dir / "model.safetensors")
    assert any(not torch.equal(a[k], initial[k]) for k in a if k in initial), (
        "the run never changed the weights"
    )
    assert all(torch.equal(a[k], b[k]) for k in a), f"{method}: resumed weights differ"
    assert _rows(full) == _rows(part)
