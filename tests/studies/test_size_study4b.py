"""scripts/size_study4b.py on hand-made pilots: the learning-curve differences, their s.d., the seeds
and hours a study would need, and the verdict, each recomputed by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from semrl.studies.stats import seeds_needed

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("size_study4b", REPO / "scripts/size_study4b.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pilot(root: Path, rng: np.random.Generator, spread: float) -> dict[tuple[str, int], np.ndarray]:
    """Four seeds of dr_grpo and rose, evaluated at steps 10, 20 and 30; returns each run's
    (pass@16, pass@1) at the three evaluations."""
    evals = {}
    for variant, hours in (("dr_grpo", 0.25), ("rose", 0.5)):
        for seed in range(300, 304):
            run = root / variant / f"seed-{seed}"
            run.mkdir(parents=True)
            values = np.clip(0.5 + spread * rng.normal(size=(3, 2)), 0, 1)
            rows = [{"step": s, "accuracy": 0.3} for s in range(1, 31)]
            for i, step in enumerate((10, 20, 30)):
                rows[step - 1].update(
                    {"eval/pass@16": values[i, 0], "eval/pass@1": values[i, 1], "eval/mean@32": values[i, 1]}
                )
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (run / "config.yaml").write_text(
                yaml.safe_dump({"algorithm": {"method": variant}, "trainer": {"seed": seed}})
            )
            (run / "sweep_done.json").write_text(
                json.dumps({"variant": variant, "seed": seed, "seconds": hours * 3600})
            )
            evals[(variant, seed)] = values
    return evals


@pytest.mark.parametrize("seed", range(4))
def test_the_pilot_sizes_study_4b_from_its_curve_differences(tmp_path, seed):
    script = _script()
    rng = np.random.default_rng(seed)
    verdicts = []
    for spread in (0.004, 0.3):
        root = tmp_path / f"pilot-{spread}"
        evals = _pilot(root, rng, spread)
        report, decided = script.size(root, REPO / "configs/study/study4b_pilot_rules.yaml", 16, 24.0)
        can = True
        for column, (rule, effect) in enumerate(script.PLANNED.items()):
            d = [
                evals[("rose", s)][:, column].mean() - evals[("dr_grpo", s)][:, column].mean()
                for s in range(300, 304)
            ]
            sd = float(np.std(d, ddof=1))
            need = seeds_needed(effect, sd)
            row = next(line for line in report.splitlines() if line.startswith(f"| {rule} "))
            cells = [c.strip() for c in row.split("|")[1:-1]]
            assert cells[2] == "4" and cells[3] == f"{np.mean(d):+.4f}" and cells[4].startswith(f"{sd:.4f} [")
            assert cells[6].split(" [")[0] == str(need)
            assert cells[7] == f"{need * 0.75:.1f}"  # 0.25 + 0.5 hours per seed
            can = can and need is not None and need <= 16 and need * 0.75 <= 24
        assert decided is can, report
        verdicts.append(decided)
    assert verdicts[0]  # a pilot with almost no spread: a small study decides


@pytest.mark.parametrize("hours_per_seed", [0.5, 1.0, 2.0])
def test_hours_given_in_place_of_the_pilots_wall_times_decide_the_budget(tmp_path, hours_per_seed):
    """With --hours-per-seed the hours column and the budget read the given hours, not the pilot's
    wall times (0.75 per seed here); the seeds needed do not change."""
    script = _script()
    evals = _pilot(tmp_path, np.random.default_rng(7), 0.004)
    report, decided = script.size(
        tmp_path, REPO / "configs/study/study4b_pilot_rules.yaml", 16, 24.0, hours_per_seed
    )
    assert f"{hours_per_seed:.2f} hours per seed" in report and "wall times: 0.75" in report
    can = True
    for column, (rule, effect) in enumerate(script.PLANNED.items()):
        d = [
            evals[("rose", s)][:, column].mean() - evals[("dr_grpo", s)][:, column].mean()
            for s in range(300, 304)
        ]
        need = seeds_needed(effect, float(np.std(d, ddof=1)))
        cells = [
            c.strip()
            for c in next(x for x in report.splitlines() if x.startswith(f"| {rule} ")).split("|")[1:-1]
        ]
        assert cells[7] == f"{need * hours_per_seed:.1f}"
        can = can and need <= 16 and need * hours_per_seed <= 24
    assert decided is can
    report_tight, decided_tight = script.size(
        tmp_path, REPO / "configs/study/study4b_pilot_rules.yaml", 16, 0.01, hours_per_seed
    )
    assert not decided_tight  # no study fits in 0.01 hours
