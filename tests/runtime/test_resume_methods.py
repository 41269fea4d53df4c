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
from tests.helpers import final_weights, tiny_run_config
from tests.method_runs import tiny_runs

# what the resume test adds to a method's tiny run (tests/method_runs.py), each for a state that must
# survive the checkpoint
RESUME_EXTRAS = {
    # a curriculum whose stage switch falls at the step the run resumes from (scores written below)
    "sent": ["data.curriculum_stages=2"],
    "treepo": ["trainer.lr=5e-3"],
    # eta changes at step 3, after the resume: the rollout reads the step from the restored run
    "latr": ["latr.eta_steps=[0,3]", "latr.eta_values=[1.0,0.5]"],
}
# every registered method, and the adaptive entropy bonus, whose coefficient moves every optimizer
# step: its state is in the checkpoint
METHODS = {
    name: [*overrides, *RESUME_EXTRAS.get(name, [])]
    for name, overrides in tiny_runs(
        entropy_bonus=[
            "algorithm.entropy_coeff=0.02",
            "algorithm.entropy_target=1.0",
            "algorithm.entropy_coeff_delta=0.01",
            "trainer.mini_batch_size=16",
        ]
    ).items()
}


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
