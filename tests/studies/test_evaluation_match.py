"""`semrl compare` sets runs side by side only when they were evaluated alike: the same held-out
problems, reward functions and evaluation settings (``semrl.studies.evaluation_match``)."""

from __future__ import annotations

import json

import pytest
import yaml

from semrl.cli import main
from semrl.config.load import load_config
from semrl.studies.evaluation_match import EVALUATION_KEYS, evaluation_differences


def _run(root, name, *overrides):
    run = root / name
    run.mkdir()
    cfg = load_config("demo", list(overrides))
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    rows = [{"step": s, "reward": 0.1 * s, "accuracy": 0.1 * s, "eval/mean@8": 0.2 * s} for s in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(run)


def test_runs_evaluated_alike_compare_and_others_are_refused_without_the_flag(tmp_path, capsys):
    a = _run(tmp_path, "a")
    same = _run(tmp_path, "same", "trainer.lr=2e-6", "algorithm.method=grpo")  # training differs only
    assert main(["compare", a, same]) == 0
    assert "Not evaluated alike" not in capsys.readouterr().out
    own = _run(
        tmp_path, "own", "data.eval=math500", "data.eval_size=4", "reward.functions=[math, final_number]"
    )
    assert main(["compare", a, own]) == 2
    err = capsys.readouterr().err
    assert "these runs were not evaluated alike" in err and "--allow-different-evaluations" in err
    for key in ("data.eval: a 'auto', own 'math500'", "data.eval_size: a 32, own 4", "reward.functions"):
        assert key in err, err
    assert main(["compare", a, own, "--allow-different-evaluations"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("**Not evaluated alike**") and "| eval/mean@8 (last) |" in out


@pytest.mark.parametrize(("section", "key"), EVALUATION_KEYS)
def test_each_evaluation_setting_is_read(tmp_path, section, key):
    """Every setting listed, changed alone in one run's config, is found (and nothing else)."""
    base = load_config("demo", []).to_dict()
    changed = json.loads(json.dumps(base))
    changed[section][key] = ["changed"] if isinstance(base[section][key], list) else "changed"
    for name, config in (("a", base), ("b", changed)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(config))
    assert list(evaluation_differences([tmp_path / "a", tmp_path / "b"])) == [f"{section}.{key}"]


def test_compare_says_when_runs_sampled_in_different_dtypes(tmp_path, capsys):
    """The dtype each run's engine sampled in (model.dtype as resolved, or rollout.vllm_dtype), from
    its config.yaml; said above the table of runs and of a sweep's runs, and not when they agree."""
    fp32 = _run(tmp_path, "fp32", "model.dtype=float32")
    same = _run(tmp_path, "same", "model.dtype=float32", "trainer.lr=2e-6")
    assert main(["compare", fp32, same]) == 0
    assert "different dtypes" not in capsys.readouterr().out
    bf16 = _run(tmp_path, "bf16", "model.dtype=bfloat16", "rollout.engine=vllm")
    assert main(["compare", fp32, bf16]) == 0
    out = capsys.readouterr().out
    assert out.startswith("**Sampled in different dtypes**: fp32 float32 (hf), bf16 bfloat16 (vllm)")
    # vllm's own dtype is the one it sampled in, whatever the trainer's
    engine_bf16 = _run(
        tmp_path, "engine", "model.dtype=float32", "rollout.engine=vllm", "rollout.vllm_dtype=bfloat16"
    )
    assert main(["compare", bf16, engine_bf16]) == 0
    assert "different dtypes" not in capsys.readouterr().out
    # a sweep directory's VARIANT/seed-S runs, as semrl sweep lays them out
    sweep = tmp_path / "sweep"
    for variant, overrides in (
        ("lr-a", ["model.dtype=float32"]),
        ("lr-b", ["model.dtype=bfloat16", "rollout.engine=vllm"]),
    ):
        (sweep / variant).mkdir(parents=True)
        _run(sweep / variant, "seed-0", *overrides)
    from semrl.studies.discovery import run_directories
    from semrl.studies.evaluation_match import dtype_note

    note = dtype_note(run_directories([sweep]))
    assert note is not None and "lr-a/seed-0 float32 (hf), lr-b/seed-0 bfloat16 (vllm)" in note
