"""Where a step's time goes: the update's phases (``time/update/<phase>_s``) add up to
``time/update_s``, the rollout's sampling is timed inside the engine, and the end-of-run table shows
both (``semrl.core.timing``, ``semrl.tracking.run_summary``)."""

from __future__ import annotations

import time

import pytest
import yaml

from semrl.core.timing import PhaseClock
from semrl.tracking import metric_names as names
from semrl.tracking.run_summary import summary_of_run
from tests.helpers import read_metrics, tiny_run_config, vllm_or_skip

PHASES = [f"time/update/{phase}_s" for phase, _ in names.UPDATE_PHASES]


def test_a_clock_adds_each_phase_and_refuses_a_nested_one():
    clock = PhaseClock()
    for _ in range(2):
        with clock.phase("a"):
            time.sleep(0.01)
    with clock.phase("b"):
        pass
    assert clock.seconds["a"] >= 0.02 and set(clock.seconds) == {"a", "b"}
    assert clock.metrics("time/update") == {
        "time/update/a_s": clock.seconds["a"],
        "time/update/b_s": clock.seconds["b"],
    }
    with pytest.raises(RuntimeError, match="do not nest"), clock.phase("c"), clock.phase("d"):
        pass


def _check_phases(run_dir, expected: set[str]) -> None:
    steps = [r for r in read_metrics(run_dir) if names.REWARD in r]
    assert len(steps) == 2
    for row in steps:
        phases = {k for k in row if k.startswith("time/update/")}
        assert phases == expected, phases ^ expected
        total = sum(row[k] for k in phases)
        # the phases cover the update: what they leave out is the loop's own bookkeeping
        assert total == pytest.approx(row[names.UPDATE_S], rel=0.05), (total, row[names.UPDATE_S])
        assert 0 < row[names.SAMPLING_S] <= row[names.ROLLOUT_S]
        assert row[names.SAMPLING_S] + row[names.AROUND_SAMPLING_S] == pytest.approx(row[names.ROLLOUT_S])
    table = summary_of_run(run_dir)
    for label in ("sampling (engine)", "forward + loss", "backward", "optimizer step", "weight sync"):
        assert label in table


def test_the_update_phases_add_up_to_its_time_on_hf(digit_model_dir, seven_task, tmp_path):
    """Every phase runs here: a KL reference, and two mini-batches so the old log-probs need a pass.
    At model.dtype=auto the hf engine on a CPU trains in float32, and config.yaml records it."""
    from semrl.runtime.trainer import Trainer

    out = tmp_path / "run"
    cfg = tiny_run_config(
        digit_model_dir,
        seven_task,
        out,
        "trainer.steps=2",
        "algorithm.kl_coef=0.01",
        "trainer.mini_batch_size=16",
        "trainer.micro_batch_size=8",
        "model.dtype=auto",
    )
    Trainer(cfg).train()
    _check_phases(out, set(PHASES))
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["dtype"] == "float32"


@pytest.mark.xdist_group("vllm")  # the worker's one vLLM engine (tests/conftest.py)
def test_the_update_phases_add_up_to_its_time_on_vllm(digit32_model_dir, seven_task, tmp_path):
    """On vllm the weight sync is a real phase (vLLM's reload of every weight)."""
    vllm_or_skip()
    from semrl.runtime.trainer import Trainer

    out = tmp_path / "run"
    Trainer(
        tiny_run_config(digit32_model_dir, seven_task, out, "trainer.steps=2", "rollout.engine=vllm")
    ).train()
    on_policy = set(PHASES) - {"time/update/old_logprobs_s", "time/update/ref_logprobs_s"}
    _check_phases(out, on_policy)
    assert all(r["time/update/sync_s"] > 0 for r in read_metrics(out) if names.REWARD in r)
