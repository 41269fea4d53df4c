"""semrl compare across seeds: aggregation, bootstrap intervals, pass@k curves, outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from semrl.cli import main
from semrl.evaluation import records_path, summarize_records
from semrl.report.seeds import (
    compare_seeds,
    find_runs,
    paired_bootstrap,
    paired_differences,
    pass_at_k_curves,
    per_step,
)


def _write_run(run_dir: Path, rows: list[dict], method: str = "grpo", seed: int = 0) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text(
        yaml.safe_dump({"algorithm": {"method": method}, "trainer": {"seed": seed}})
    )
    return run_dir


def _records(rng: np.random.Generator, num_problems: int, n: int, p: np.ndarray) -> list[dict]:
    """Problem records whose samples are correct with probability p[i] for problem i."""
    out = []
    for i in range(num_problems):
        correct = rng.random(n) < p[i]
        out.append(
            {
                "id": f"q{i}",
                "gold": "1",
                "level": 1,
                "subject": None,
                "samples": [
                    {
                        "response": "",
                        "answer": "1" if c else "2",
                        "correct": bool(c),
                        "length": 10 + j,
                        "truncated": False,
                        "timed_out": False,
                        "cluster": 0 if c else 1,
                    }
                    for j, c in enumerate(correct)
                ],
            }
        )
    return out


def _write_eval(run_dir: Path, step: int, records: list[dict]) -> dict:
    path = records_path(run_dir, "eval", step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return {f"eval/{k}": v for k, v in summarize_records(records).items()}


def test_per_step_mean_and_standard_error_match_hand_computation(tmp_path):
    rewards = {0: [0.1, 0.2, 0.3], 1: [0.4, 0.6, 0.3], 2: [0.7, 0.1]}  # seed 2 stopped after step 2
    for seed, values in rewards.items():
        _write_run(
            tmp_path / "a" / f"seed-{seed}", [{"step": i + 1, "reward": v} for i, v in enumerate(values)]
        )
    _write_run(tmp_path / "a" / "seed-9.interrupted", [{"step": 1, "reward": 5.0}])  # not a run of the sweep
    (groups) = find_runs([tmp_path])
    points = per_step(groups["a"], "reward")
    # step 1: 0.1, 0.4, 0.7 -> mean 0.4, sd 0.3, s.e. 0.3 / sqrt(3)
    assert (
        points[0][0] == 1
        and points[0][1] == pytest.approx(0.4)
        and points[0][2] == pytest.approx(0.3 / math.sqrt(3))
    )
    assert points[0][3] == 3
    # step 2: 0.2, 0.6, 0.1 -> mean 0.3, sd sqrt(((-.1)^2 + .3^2 + (-.2)^2) / 2) = sqrt(0.07)
    assert points[1][1] == pytest.approx(0.3) and points[1][2] == pytest.approx(
        math.sqrt(0.07) / math.sqrt(3)
    )
    # step 3: only two seeds
    assert points[2][1:] == (pytest.approx(0.3 * 0.5 + 0.3 * 0.5), pytest.approx(0.0), 2)
    md = compare_seeds([tmp_path])
    assert "0.400 ± 0.173 (3)" in md and "seeds [0, 1, 2]" in md


def test_group_by_a_config_key_over_run_directories(tmp_path):
    dirs = [
        _write_run(tmp_path / f"r{i}", [{"step": 1, "reward": float(i)}], method=m, seed=s)
        for i, (m, s) in enumerate([("grpo", 0), ("rose", 0), ("grpo", 1), ("rose", 1)])
    ]
    groups = find_runs(dirs, "algorithm.method")
    assert {v: [r.seed for r in runs] for v, runs in groups.items()} == {"grpo": [0, 1], "rose": [0, 1]}
    assert per_step(groups["rose"], "reward")[0][1] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="two runs with seed 0"):
        find_runs(
            dirs[:2] + [_write_run(tmp_path / "r9", [{"step": 1}], method="grpo", seed=0)], "algorithm.method"
        )
    with pytest.raises(ValueError, match="no key 'trainer.nope'"):
        find_runs(dirs, "trainer.nope")


def test_bootstrap_interval_covers_a_known_difference():
    rng = np.random.default_rng(0)
    covered, excluded_zero = 0, 0
    trials = 60
    for t in range(trials):
        # 3 seeds x 40 problems; per-seed shifts and per-problem noise around a true difference of 0.1
        diffs = [0.1 + rng.normal(0, 0.02) + rng.normal(0, 0.15, 40) for _ in range(3)]
        est, lo, hi = paired_bootstrap(diffs, num_resamples=400, seed=t)
        assert lo <= est <= hi
        covered += lo <= 0.1 <= hi
        excluded_zero += lo > 0
    assert covered >= 0.85 * trials  # a 95% interval; a percentile bootstrap of 3 seeds runs a little narrow
    assert excluded_zero >= 0.9 * trials
    # no difference: the interval holds 0 in most trials
    holds_zero = sum(
        (lambda e: e[1] <= 0 <= e[2])(
            paired_bootstrap([rng.normal(0, 0.15, 40) for _ in range(3)], 400, seed=t)
        )
        for t in range(trials)
    )
    assert holds_zero >= 0.85 * trials
    # a constant difference has a degenerate interval
    assert paired_bootstrap([np.full(5, 0.25)] * 3, 100) == pytest.approx((0.25, 0.25, 0.25))


def _study(tmp_path: Path, n: int = 8) -> tuple[Path, dict]:
    """A synthetic sweep: variants base_like and better (per-problem success up by 0.2), 3 seeds each,
    every run with a step-0 and a final evaluation whose records and metrics agree."""
    rng = np.random.default_rng(1)
    truth: dict = {}
    for seed in range(3):
        p = rng.uniform(0.05, 0.6, 30)
        start = _records(rng, 30, n, p)
        for variant, lift in (("base_like", 0.0), ("better", 0.2)):
            run = tmp_path / "sweep" / variant / f"seed-{seed}"
            final = _records(rng, 30, n, np.clip(p + lift, 0, 1))
            truth[(variant, seed)] = final
            rows = [
                {"step": 0, **_write_eval(run, 0, start)},
                {"step": 1, "reward": lift},
                {"step": 2, "reward": lift, **_write_eval(run, 2, final)},
            ]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        truth[("base", seed)] = start
    return tmp_path / "sweep", truth


def _pass_at_k_by_comb(records: list[dict], k: int) -> float:
    values = []
    for r in records:
        n, c = len(r["samples"]), sum(s["correct"] for s in r["samples"])
        values.append(1.0 - math.comb(n - c, k) / math.comb(n, k))
    return float(np.mean(values))


def test_pass_at_k_curves_follow_the_unbiased_estimator(tmp_path):
    sweep, truth = _study(tmp_path)
    curves = pass_at_k_curves(find_runs([sweep]), "eval")
    assert list(curves) == ["base model", "base_like", "better"]
    for name, key in (("base model", "base"), ("better", "better")):
        for k, mean, se, n in curves[name]:
            per_seed = [_pass_at_k_by_comb(truth[(key, s)], k) for s in range(3)]
            assert n == 3 and mean == pytest.approx(np.mean(per_seed))
            assert se == pytest.approx(np.std(per_seed, ddof=1) / math.sqrt(3))
    assert [p[0] for p in curves["better"]] == list(range(1, 9))


def test_paired_differences_pair_seeds_and_problems(tmp_path):
    sweep, truth = _study(tmp_path)
    groups = find_runs([sweep])
    est, lo, hi, seeds = paired_differences(groups["better"], groups["base_like"], "eval", "mean@8", 500)
    expected = np.mean(
        [
            np.mean(
                [
                    sum(s["correct"] for s in a["samples"]) / 8 - sum(s["correct"] for s in b["samples"]) / 8
                    for a, b in zip(truth[("better", s)], truth[("base_like", s)], strict=True)
                ]
            )
            for s in range(3)
        ]
    )
    assert seeds == 3 and est == pytest.approx(expected) and lo < est < hi
    assert lo > 0  # a lift of 0.2 per problem is found
    est4 = paired_differences(groups["better"], groups["base_like"], "eval", "pass@4", 200)[0]
    expected4 = np.mean(
        [
            _pass_at_k_by_comb(truth[("better", s)], 4) - _pass_at_k_by_comb(truth[("base_like", s)], 4)
            for s in range(3)
        ]
    )
    assert est4 == pytest.approx(expected4)


def test_cli_writes_markdown_html_json_and_figures(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    sweep, _ = _study(tmp_path)
    out = tmp_path / "cmp"
    assert (
        main(["compare", str(sweep), "--baseline", "base_like", "--output", str(out), "--resamples", "200"])
        == 0
    )
    printed = capsys.readouterr().out
    assert "paired difference against base_like" in printed and "| better | mean@8 |" in printed
    assert "| base model (step 0) |" in printed
    for name in (
        "results.md",
        "index.html",
        "aggregate.json",
        "figures/pass_at_k_eval.png",
        "figures/reward.png",
    ):
        assert (out / name).is_file(), name
    page = (out / "index.html").read_text()
    assert "data:image/png;base64," in page and "paired difference" in page
    assert json.loads((out / "aggregate.json").read_text())["seeds"] == {
        "base_like": [0, 1, 2],
        "better": [0, 1, 2],
    }
    assert main(["compare", str(sweep), "--baseline", "nope"]) == 2
    assert "is not a variant" in capsys.readouterr().err
