"""`semrl compare` sets runs side by side only when they were evaluated alike: the same held-out
problems, reward functions and evaluation settings (``semrl.studies.evaluation_match``)."""

from __future__ import annotations

import dataclasses
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


# What decides how held-out samples are drawn and judged, as this test knows it (not read from the
# code's lists, so that a setting left out of them is noticed): changed alone, each one is reported.
DECIDES_HELD_OUT = (
    "data.eval",
    "data.eval_size",
    "data.eval_split",
    "data.problem_key",
    "data.answer_key",
    "data.system_prompt",
    "data.prompt_template",
    "reward.functions",
    "reward.weights",
    "reward.correctness",
    "reward.final_number_fallback",
    "reward.numeral_answers",
    "reward.refuse_restatements",
    "reward.timeout_s",
    "logging.eval_samples",
    "logging.eval_temperature",
    "rollout.max_new_tokens",
    "rollout.temperature",  # the demo's logging.eval_temperature is null: the held-out temperature
    "rollout.top_p",
    "rollout.top_k",
)
# The model and what samples it: compared runs differ here by design (the dtype has its own note).
MODEL_SIDE = {
    "model.name",
    "model.dtype",
    "model.master_weights",
    "model.lora_r",
    "model.attn_implementation",
    "rollout.engine",
    "rollout.generation_batch_size",
    "rollout.vllm_block_size",
    "rollout.vllm_dtype",
    "rollout.vllm_max_num_seqs",
    "rollout.vllm_max_num_batched_tokens",
    "trainer.seed",
}


def _changed(value):
    """Another value of ``value``'s type (not checked: only read)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, list | tuple):
        return ["changed"]
    return "changed"


@pytest.mark.parametrize("name", DECIDES_HELD_OUT)
def test_each_setting_that_decides_held_out_samples_is_reported(tmp_path, name):
    """Every such setting, changed alone in one run's config, is found (and nothing else)."""
    section, key = name.split(".")
    base = load_config("demo", []).to_dict()
    assert base["logging"]["eval_temperature"] is None
    changed = json.loads(json.dumps(base))
    changed[section][key] = _changed(base[section][key])
    for run, config in (("a", base), ("b", changed)):
        (tmp_path / run).mkdir()
        (tmp_path / run / "config.yaml").write_text(yaml.safe_dump(config))
    reported = list(evaluation_differences([tmp_path / "a", tmp_path / "b"]))
    if name == "logging.eval_temperature":  # set in b, it takes over from b's rollout.temperature
        assert reported == [name, "rollout.temperature"]
    else:
        assert reported == [name]


def test_rollout_temperature_decides_nothing_where_the_evaluation_has_its_own(tmp_path):
    a = _run(tmp_path, "a", "logging.eval_temperature=0.6", "rollout.temperature=1.0")
    b = _run(tmp_path, "b", "logging.eval_temperature=0.6", "rollout.temperature=0.8")
    assert evaluation_differences([a, b]) == {}


def test_every_setting_of_the_held_out_cache_key_is_compared_or_model_side():
    """The held-out cache key and compare's list cannot drift: every option that changes the cache
    key (each changed alone) is one compare checks or one of the model's own."""
    from semrl.evaluation.held_out import evaluation_key

    cfg = load_config("demo", [])
    base = evaluation_key(cfg, [], "eval", 1)
    in_key = set()
    for section_name, section in cfg.to_dict().items():
        if not isinstance(section, dict) or not hasattr(cfg, section_name):  # a method's options
            continue
        for key, value in section.items():
            changed_section = dataclasses.replace(getattr(cfg, section_name), **{key: _changed(value)})
            changed = dataclasses.replace(cfg, **{section_name: changed_section})
            if evaluation_key(changed, [], "eval", 1) != base:
                in_key.add(f"{section_name}.{key}")
    assert {"reward.refuse_restatements", "rollout.top_k", "model.name"} <= in_key
    assert in_key - MODEL_SIDE <= set(DECIDES_HELD_OUT), in_key - MODEL_SIDE - set(DECIDES_HELD_OUT)
    assert in_key - MODEL_SIDE == {f"{s}.{k}" for s, k in EVALUATION_KEYS} - {
        f"data.{k}" for k in ("eval", "eval_size", "eval_split", "problem_key", "answer_key")
    }


def test_the_refusal_pins_each_value_on_its_own_run(tmp_path, capsys):
    """A run without config.yaml is left out of the comparison, and the values after it are still
    named by their own runs."""
    missing = tmp_path / "missing"
    missing.mkdir()
    a = _run(tmp_path, "a", "rollout.top_k=0")
    b = _run(tmp_path, "b", "rollout.top_k=20")
    assert main(["compare", str(missing), a, b]) == 2
    err = capsys.readouterr().err
    assert "rollout.top_k: a 0, b 20" in err, err


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
