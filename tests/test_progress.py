"""Progress: a bar without a time estimate until a share of its work is done, and one plain line per
step and per evaluation where no bar can draw (``semrl.tracking.progress``)."""

from __future__ import annotations

import re

import pytest

from semrl.tracking.progress import EVIDENCE, Progress, step_line


def test_a_bar_estimates_only_after_a_share_of_its_work(monkeypatch):
    monkeypatch.setattr("semrl.tracking.progress.can_draw", lambda: True)
    bar = Progress(100, "eval", "sample", enabled=True)
    shown = []
    for _ in range(100):
        bar.update(1)
        shown.append(bar.bar.bar_format is None)
    bar.close()
    assert shown.index(True) == int(EVIDENCE * 100) - 1  # the estimate appears at 25 of 100
    assert not bar.plain


def test_without_a_terminal_the_caller_logs_lines_and_off_means_nothing(monkeypatch):
    monkeypatch.setattr("semrl.tracking.progress.can_draw", lambda: False)
    assert Progress(10, "train", "step", enabled=True).plain
    assert not Progress(10, "train", "step", enabled=False).plain
    line = step_line(
        {
            "step": 3,
            "reward": 0.5,
            "accuracy": 0.25,
            "response_length": 12.0,
            "time/step_s": 4.2,
            "eval/mean@8": 0.6,
        },
        10,
    )
    assert line == "step 3/10: reward 0.500, accuracy 0.250, length 12.0, 4.2 s, held-out mean@8 0.600"


@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize("progress", [True, False])
def test_a_run_without_a_terminal_logs_one_line_per_step_and_evaluation(
    digit_model_dir, seven_task, tmp_path, progress
):
    from tests.forked import run_semrl
    from tests.helpers import tiny_run_overrides

    overrides = tiny_run_overrides(
        digit_model_dir,
        seven_task,
        tmp_path / "run",
        "trainer.steps=2",
        f"data.eval={seven_task}",
        "data.eval_size=2",
        "logging.eval_samples=2",
        f"logging.progress={str(progress).lower()}",
    )
    out = run_semrl("train", *overrides)  # stderr is a pipe: no bar can draw
    assert out.returncode == 0, out.stderr[-2000:]
    steps = re.findall(r"INFO semrl\.runtime\.trainer: step (\d)/2: reward", out.stderr)
    evaluations = re.findall(r"INFO semrl\.evaluation\.held_out: eval after step (\d): 4 samples", out.stderr)
    assert (steps, evaluations) == ((["1", "2"], ["0", "2"]) if progress else ([], []))
    assert "\r" not in out.stderr  # no bar drawn into the log
