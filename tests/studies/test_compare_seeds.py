"""semrl compare across seeds: aggregation, paired comparisons, the token axis, pass@k curves, outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from semrl.cli import main
from semrl.evaluation import records_path, summarize_records
from semrl.studies.comparison import (
    cumulative_tokens,
    equal_token_budget,
    per_step,
    seed_differences,
    value_at_tokens,
)
from semrl.studies.discovery import find_runs
from semrl.studies.seeds import compare_seeds
from semrl.studies.stats import compare_paired
from semrl.studies.tables import pass_at_k_curves


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
                {"step": 1, "reward": lift, "rollout/sampled_tokens": 100},
                {"step": 2, "reward": lift, "rollout/sampled_tokens": 90, **_write_eval(run, 2, final)},
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


def test_seed_differences_are_the_mean_per_problem_differences(tmp_path):
    sweep, truth = _study(tmp_path)
    groups = find_runs([sweep])
    d = seed_differences(groups["better"], groups["base_like"], "eval/mean@8")
    expected = [
        np.mean(
            [
                sum(s["correct"] for s in a["samples"]) / 8 - sum(s["correct"] for s in b["samples"]) / 8
                for a, b in zip(truth[("better", s)], truth[("base_like", s)], strict=True)
            ]
        )
        for s in range(3)
    ]
    assert d == pytest.approx(expected)
    c = compare_paired(d)
    assert c.seeds == 3 and c.low < c.estimate < c.high and c.low > 0  # a lift of 0.2 per problem is found
    d4 = seed_differences(groups["better"], groups["base_like"], "eval/pass@4")
    assert d4 == pytest.approx(
        [
            _pass_at_k_by_comb(truth[("better", s)], 4) - _pass_at_k_by_comb(truth[("base_like", s)], 4)
            for s in range(3)
        ]
    )


def test_equal_token_comparison_interpolates_at_the_smallest_budget(tmp_path):
    """Variant 'tree' samples 60 tokens a step, 'flat' 100: at equal tokens (the 120 tree sampled in
    2 steps) flat is read between its steps 1 (100 tokens) and 2 (200)."""
    for seed in range(2):
        _write_run(
            tmp_path / "s" / "flat" / f"seed-{seed}",
            [
                {"step": 0, "eval/mean@4": 0.1},
                {"step": 1, "rollout/sampled_tokens": 100, "accuracy": 0.2},
                {"step": 2, "rollout/sampled_tokens": 100, "accuracy": 0.6, "eval/mean@4": 0.5 + seed / 10},
            ],
        )
        _write_run(
            tmp_path / "s" / "tree" / f"seed-{seed}",
            [
                {"step": 0, "eval/mean@4": 0.1},
                {"step": 1, "rollout/sampled_tokens": 60, "accuracy": 0.3},
                {"step": 2, "rollout/sampled_tokens": 60, "accuracy": 0.5, "eval/mean@4": 0.4},
            ],
        )
    groups = find_runs([tmp_path / "s"])
    assert cumulative_tokens(groups["flat"][0]) == {0: 0.0, 1: 100.0, 2: 200.0}
    assert equal_token_budget(groups) == 120.0
    assert value_at_tokens(groups["flat"][0], "accuracy", 120.0) == pytest.approx(0.2 + 0.4 * 0.2)
    # the held-out metric between the base evaluation (0 tokens) and the final one (200)
    assert value_at_tokens(groups["flat"][1], "eval/mean@4", 120.0) == pytest.approx(0.1 + 0.5 * 0.6)
    assert value_at_tokens(groups["flat"][0], "accuracy", 250.0) is None
    assert seed_differences(groups["tree"], groups["flat"], "eval/mean@4", 120.0) == pytest.approx(
        [0.4 - (0.1 + 0.4 * 0.6), 0.4 - (0.1 + 0.5 * 0.6)]
    )
    md = compare_seeds([tmp_path / "s"], baseline="flat")
    # evaluated only before and after training: no held-out table at equal tokens (a straight line)
    assert "none at equal sampled tokens: the runs evaluated only before and after training" in md
    assert "| tree - flat | mean@4 | +0.030 |" not in md
    assert "at equal sampled tokens (120)" in md  # the training metrics are compared there
    # with an evaluation during training, the held-out value at 120 tokens is read between real ones
    for seed in range(2):
        for variant in ("flat", "tree"):
            path = tmp_path / "s" / variant / f"seed-{seed}" / "metrics.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            rows[1]["eval/mean@4"] = 0.1
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = compare_seeds([tmp_path / "s"], baseline="flat")
    assert "(120; read linearly between the evaluations around it; 95% t-interval)" in md
    assert "| tree - flat | mean@4 | " in md.split("read linearly between the evaluations around it; 95%")[1]
    # training accuracy at 120 tokens: tree's step 2 (0.5), flat between steps 1 and 2 (0.28)
    training = md.split("**Training metrics at equal sampled tokens (120), mean ± s.e. (n seeds)**")[1]
    assert "| tree | 0.500 ± 0.000 (2) |" in training and "| flat | 0.280 ± 0.000 (2) |" in training
    paired = md.split("**Training metrics at equal sampled tokens (120): paired differences")[1]
    assert "| tree - flat | accuracy | +0.220 | [+0.220, +0.220] | 2 | 2 / 0 / 0 |" in paired
    # runs that never logged their tokens: no equal-token section
    _write_run(tmp_path / "s" / "old" / "seed-0", [{"step": 1, "accuracy": 0.1}])
    assert equal_token_budget(find_runs([tmp_path / "s"])) is None


def test_cli_writes_markdown_html_json_and_figures(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    sweep, _ = _study(tmp_path)
    out = tmp_path / "cmp"
    assert (
        main(["compare", str(sweep), "--baseline", "base_like", "--output", str(out), "--x-axis", "tokens"])
        == 0
    )
    printed = capsys.readouterr().out
    assert "paired differences at equal steps" in printed and "| better - base_like | mean@8 |" in printed
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
    assert "data:image/png;base64," in page and "paired differences" in page
    assert json.loads((out / "aggregate.json").read_text())["seeds"] == {
        "base_like": [0, 1, 2],
        "better": [0, 1, 2],
    }
    assert main(["compare", str(sweep), "--baseline", "nope"]) == 2
    assert "is not a variant" in capsys.readouterr().err


def test_seeds_keeps_only_the_seeds_named(tmp_path, capsys):
    """--seeds 0 2 aggregates and pairs those seeds only: the means, the paired differences and the
    title match a sweep that holds just seeds 0 and 2."""
    sweep, truth = _study(tmp_path)
    groups = find_runs([sweep], seeds=[0, 2])
    assert {v: [r.seed for r in runs] for v, runs in groups.items()} == {
        "base_like": [0, 2],
        "better": [0, 2],
    }
    d = seed_differences(groups["better"], groups["base_like"], "eval/pass@4")
    assert d == pytest.approx(
        [
            _pass_at_k_by_comb(truth[("better", s)], 4) - _pass_at_k_by_comb(truth[("base_like", s)], 4)
            for s in (0, 2)
        ]
    )
    md = compare_seeds([sweep], seeds=[0, 2])
    assert "seeds [0, 2]" in md and "base_like (2)" in md
    better = [_pass_at_k_by_comb(truth[("better", s)], 1) for s in (0, 2)]
    expected = f"{np.mean(better):.3f} ± {np.std(better, ddof=1) / math.sqrt(2):.3f} (2)"
    assert expected in md
    assert main(["compare", str(sweep), "--seeds", "0", "7"]) == 2
    assert "no finished run has seed 7" in capsys.readouterr().err
    run = sweep / "better" / "seed-0"
    assert main(["compare", str(run), str(sweep / "base_like" / "seed-0"), "--seeds", "0"]) == 2
    assert "--seeds compares variants across seeds" in capsys.readouterr().err


def test_a_missing_sweep_directory_says_it_is_missing(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty")]) == 2
    assert "holds no VARIANT/seed-S run" in capsys.readouterr().err


def test_each_variant_has_one_colour_in_every_figure(tmp_path, monkeypatch):
    """The base model and every variant keep their colour from figure to figure (pass@k, per-step
    curves), fixed by the name: a method's own, else a stable pick."""
    pytest.importorskip("matplotlib")
    import matplotlib.axes
    from matplotlib.colors import to_hex

    from semrl.studies.runs import METHOD_COLORS, method_color

    drawn: list[tuple[str, str]] = []
    real = matplotlib.axes.Axes.plot

    def recording(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        lines = real(self, *args, **kwargs)
        drawn.extend((line.get_label(), to_hex(line.get_color())) for line in lines)
        return lines

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    sweep, _ = _study(tmp_path)
    compare_seeds([sweep], output=tmp_path / "cmp")
    colours: dict[str, set[str]] = {}
    for label, colour in drawn:
        colours.setdefault(label, set()).add(colour)
    assert set(colours) == {"base model", "base_like", "better"}
    assert all(colours[name] == {method_color(name)} for name in colours)
    assert (
        method_color("base model") == METHOD_COLORS["base model"]
        and method_color("rose") == METHOD_COLORS["rose"]
    )
    assert method_color("my_variant") == method_color("my_variant")  # stable, not drawn from a cycle


def _lab(hex_colour: str, cvd: np.ndarray | None) -> np.ndarray:
    """CIELAB (D65) of an sRGB colour, as seen with the colour-vision deficiency ``cvd`` (a linear-RGB
    matrix of Machado, Oliveira & Fernandes 2009) or with normal vision."""
    srgb = np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    linear = np.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)
    if cvd is not None:
        linear = np.clip(cvd @ linear, 0, 1)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    f = np.cbrt(xyz / np.array([0.95047, 1.0, 1.08883]))
    f = np.where(f**3 > 0.008856, f, (xyz / np.array([0.95047, 1.0, 1.08883]) * 903.3 + 16) / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_method_colours_stay_apart_for_red_green_colour_blind_readers():
    """The methods a study compares keep a CIE76 distance of at least 15 under simulated protanopia
    and deuteranopia (severity 1) as well as normal vision; tab10's ROSE green and SENT red, which
    this palette replaced, were 7 apart under deuteranopia."""
    from semrl.studies.runs import METHOD_COLORS

    protan = np.array(
        [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]]
    )
    deutan = np.array(
        [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]]
    )
    names = ["base model", "dr_grpo", "grpo", "rose", "sent", "treepo", "latr"]
    for cvd in (None, protan, deutan):
        labs = {n: _lab(METHOD_COLORS[n], cvd) for n in names}
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                assert np.linalg.norm(labs[a] - labs[b]) >= 15, (a, b)
    assert np.linalg.norm(_lab("#2ca02c", deutan) - _lab("#d62728", deutan)) < 15  # what it replaced
