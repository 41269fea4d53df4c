"""The table printed at the end of ``semrl train``."""

from __future__ import annotations

import re

from semrl.tracking.run_summary import MAX_STEP_ROWS, run_summary


def _rows(steps: int, with_eval: bool = True):
    rows = []
    if with_eval:
        rows.append(
            {
                "step": 0,
                "eval/problems": 32.0,
                "eval/mean@8": 0.125,
                "eval/pass@8": 0.5,
                "eval/maj@8": 0.25,
                "eval/response_length": 60.0,
                "eval/truncated_frac": 0.8,
            }
        )
    for s in range(1, steps + 1):
        rows.append(
            {
                "step": s,
                "reward": s / 100,
                "accuracy": s / 200,
                "response_length": 50.0 - s / 10,
                "time/step_s": 30.0,
            }
        )
    if with_eval:
        rows.append(
            {
                "step": steps,
                "eval/problems": 32.0,
                "eval/mean@8": 0.75,
                "eval/pass@8": 0.9,
                "eval/maj@8": 0.8,
                "eval/response_length": 25.5,
                "eval/truncated_frac": 0.05,
            }
        )
    return rows


def test_summary_has_before_after_steps_and_paths():
    text = run_summary(_rows(3), "runs/x")
    assert "run finished: runs/x  (3 steps, 1.5 min training)" in text
    assert re.search(r"mean@8\s+0\.125\s+0\.750", text) and re.search(r"truncated\s+80%\s+5%", text)
    assert re.search(r"^\s+3\s+0\.030\s+0\.015\s+49\.7\s+30\.0$", text, re.M)
    assert "semrl report runs/x" in text and "runs/x/metrics.jsonl" in text


def test_long_runs_show_every_nth_step_and_the_last():
    text = run_summary(_rows(45, with_eval=False), "r")
    step_lines = [line for line in text.splitlines() if re.match(r"^\s+\d+\s+0\.\d{3}", line)]
    assert len(step_lines) <= MAX_STEP_ROWS + 1 and step_lines[-1].split()[0] == "45"
    assert "one step in 3" in text and "held-out" not in text


def test_summary_gives_the_evaluation_time_beside_the_training_time():
    rows = _rows(3)
    rows[0]["time/eval_s"], rows[-1]["time/eval_s"] = 60.0, 30.0
    assert "(3 steps, 1.5 min training, 1.5 min evaluation)" in run_summary(rows, "runs/x")


def test_the_rollout_cost_shows_beside_each_step_when_logged():
    rows = _rows(2)
    for r in rows[1:3]:
        r.update(
            {
                "rollout/sampled_tokens": 3000.0,
                "rollout/prefill_tokens": 410.0,
                "rollout/running_batch": 37.25,
            }
        )
    text = run_summary(rows, "runs/x")
    assert "sampled  prefill   batch" in text
    assert re.search(r"^\s+2\s+0\.020\s+0\.010\s+49\.8\s+30\.0\s+3000\s+410\s+37\.2$", text, re.M), text
    assert "prefill" not in run_summary(_rows(2), "runs/x")  # runs from before the cost was logged
