"""The metric names that reports and studies read (``semrl.tracking.metric_names``) are the names a
run writes: a tiny Dr.GRPO run with a KL term and an evaluation, and a tiny ROSE run, log every one,
and every reader's list is drawn from the module (a renamed metric fails here, not in an empty report)."""

from __future__ import annotations

import json

from semrl.config.load import load_config
from semrl.tracking import metric_names as names
from tests.helpers import DIGIT_SYSTEM_PROMPT


def _run(model_dir, task, out, *extra) -> list[dict]:
    from semrl.runtime.trainer import Trainer

    cfg = load_config(
        None,
        [
            f"model.name={model_dir}",
            f"data.train={task}",
            f"data.eval={task}",
            "data.eval_size=4",
            f"data.system_prompt={DIGIT_SYSTEM_PROMPT}",
            "rollout.group_size=4",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=4",
            "trainer.micro_batch_size=8",
            "trainer.steps=1",
            "reward.num_workers=1",
            "logging.eval_samples=2",
            f"logging.output_dir={out}",
            "logging.progress=false",
            "logging.report_to=[]",
            *extra,
        ],
    )
    Trainer(cfg).train()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_run_writes_every_name_the_reports_read(digit_model_dir, seven_task, tmp_path):
    rows = _run(digit_model_dir, seven_task, tmp_path / "dr_grpo", "algorithm.kl_coef=0.01")
    step = next(r for r in rows if names.REWARD in r)
    assert not [n for n in names.EVERY_STEP if n not in step]
    assert names.KL in step
    evaluated = [r for r in rows if names.EVAL_S in r]
    assert evaluated and all(names.EVAL_PROBLEMS in r for r in evaluated)
    rose = _run(digit_model_dir, seven_task, tmp_path / "rose", "algorithm.method=rose")
    step = next(r for r in rose if names.REWARD in r)
    assert not [n for n in names.ROSE if n not in step]


def test_every_reader_takes_its_names_from_the_module():
    from semrl.studies.decide import NO_SIGNAL
    from semrl.studies.discovery import CURVE_METRICS, TOKENS
    from semrl.studies.runs import COMPARE_METRICS, TRAIN_METRICS
    from semrl.tracking.metrics import COST_METRICS
    from semrl.tracking.run_summary import COST_COLUMNS

    known = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    known |= {n for k, v in vars(names).items() if k.isupper() and isinstance(v, tuple) for n in v}
    for read in (
        COMPARE_METRICS,
        TRAIN_METRICS,
        CURVE_METRICS,
        COST_METRICS,
        COST_COLUMNS,
        [NO_SIGNAL, TOKENS],
    ):
        assert set(read) <= known, set(read) - known
