"""Config loading, overrides and validation errors."""

import re

import pytest

from semrl.cli import main
from semrl.config.files import parse_overrides
from semrl.config.load import config_reference, load_config
from semrl.config.sections import Config, ConfigError


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  lr: 1.0e-5\n  steps: 3\nrollout:\n  group_size: 4\n")
    cfg = load_config(path, ["trainer.lr=2e-6", "rollout.top_k=20", "algorithm.method=grpo"])
    assert cfg.trainer.lr == 2e-6 and isinstance(cfg.trainer.lr, float)
    assert cfg.trainer.steps == 3 and cfg.rollout.group_size == 4 and cfg.rollout.top_k == 20
    assert cfg.algorithm.method == "grpo"


def test_unknown_key_names_closest():
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer\.lrr'.*Did you mean 'trainer\.lr'"):
        load_config(None, ["trainer.lrr=1e-5"])
    with pytest.raises(ConfigError, match=r"unknown config key 'trainr'.*'trainer'"):
        load_config(None, ["trainr.lr=1e-5"])


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match=r"'trainer\.steps': expected an integer"):
        load_config(None, ["trainer.steps=ten"])
    with pytest.raises(ConfigError, match=r"'model\.dtype'.*not one of"):
        load_config(None, ["model.dtype=float64"])
    with pytest.raises(ConfigError, match=r"'logging\.progress': expected true or false"):
        load_config(None, ["logging.progress=3"])


def test_unknown_method_suggests():
    with pytest.raises(ConfigError, match=r"Did you mean 'dr_grpo'"):
        load_config(None, ["algorithm.method=drgrpo"])


def test_cross_field_validation():
    with pytest.raises(ConfigError, match="mini_batch_size"):
        load_config(None, ["rollout.group_size=8", "rollout.prompts_per_step=2", "trainer.mini_batch_size=5"])
    with pytest.raises(ConfigError, match="top_p"):
        load_config(None, ["rollout.top_p=0"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_override_syntax():
    assert parse_overrides(["a.b=1", "a.c=x", "d=null"]) == {"a": {"b": 1, "c": "x"}, "d": None}
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_overrides(["trainer.lr"])


def test_reference_documents_every_key():
    ref = config_reference()
    cfg = Config()
    for section, values in cfg.to_dict().items():
        for key in values:
            assert f"`{section}.{key}`" in ref


def test_shipped_configs_are_valid():
    from pathlib import Path

    import yaml

    from semrl.studies.sweep import load_sweep

    for path in sorted((Path(__file__).parents[2] / "configs").glob("*.yaml")):
        if "variants" in (
            yaml.safe_load(path.read_text()) or {}
        ):  # a sweep file: every run's config is checked
            assert load_sweep(path).runs
        else:
            load_config(path)


def test_a_loaded_config_is_final():
    import dataclasses

    cfg = load_config(None, ["algorithm.method=rose"])
    assert (
        cfg.algorithm.norm_adv_by_std is False and cfg.algorithm.policy_loss == "ppo"
    )  # the method's defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.trainer.lr = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.section("rose").epsilon = 0.1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.methods["rose"] = None  # type: ignore[index]


def test_method_sections_belong_to_their_methods():
    cfg = load_config(None, ["algorithm.method=kl_cov", "kl_cov.ratio=0.01", "clip_cov.ub=4"])
    assert cfg.section("kl_cov").ratio == 0.01 and cfg.section("clip_cov").ub == 4.0
    assert cfg.methods["kl_cov"] is cfg.section("kl_cov")
    with pytest.raises(KeyError, match="no method section 'nope'"):
        cfg.section("nope")
    assert {"rose", "sent", "fr3e", "seed_grpo", "kl_cov", "clip_cov", "entropy_8020"} <= set(cfg.to_dict())
    with pytest.raises(ConfigError, match="'kl_cov.ratio' must be in"):
        load_config(None, ["kl_cov.ratio=2"])
    with pytest.raises(ConfigError, match="rose.sd_top_k"):  # a method's check runs when it is selected
        load_config(None, ["algorithm.method=rose", "rose.sd_top_k=30"])
    load_config(None, ["algorithm.method=grpo", "rose.sd_top_k=30"])


def test_docs_config_reference_is_generated_from_the_registry():
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert config_reference() in page, "regenerate docs/config-reference.md's table with 'semrl config'"


def test_clip_cov_defaults_to_its_recipes_clip_range():
    cfg = load_config(None, ["algorithm.method=clip_cov"])
    assert (cfg.algorithm.clip_ratio_low, cfg.algorithm.clip_ratio_high) == (1.0, 1.0)
    assert load_config(None, ["algorithm.method=grpo"]).algorithm.clip_ratio_high == 0.2
    assert (
        load_config(
            None, ["algorithm.method=clip_cov", "algorithm.clip_ratio_high=0.3"]
        ).algorithm.clip_ratio_high
        == 0.3
    )


def _ranged_options():
    import dataclasses

    from semrl.config.load import method_sections as _method_sections
    from semrl.config.sections import core_sections as _core_sections

    for section, cls in [*_core_sections().items(), *sorted(_method_sections().items())]:
        for f in dataclasses.fields(cls):
            if f.metadata.get("range") is not None:
                yield f"{section}.{f.name}", f.metadata["range"], f.type


def test_every_numeric_option_has_a_range():
    """Learning rates, coefficients, temperatures, probabilities and sizes: every int or float key
    of every section declares the values it takes (options.Range)."""
    import dataclasses
    import typing

    from semrl.config.load import method_sections as _method_sections
    from semrl.config.sections import core_sections as _core_sections

    unranged = []
    for section, cls in [*_core_sections().items(), *sorted(_method_sections().items())]:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            numeric = {int, float} & {
                a for a in (hints[f.name], *typing.get_args(hints[f.name])) for a in (a, *typing.get_args(a))
            }
            if numeric and f.metadata.get("range") is None:
                unranged.append(f"{section}.{f.name}")
    assert unranged == []


def test_method_options_built_in_python_keep_their_declared_ranges():
    """One mechanism: a method's option class checks the ranges its fields declare when it is
    constructed, as loading a config does; a value just outside fails naming the key."""
    import dataclasses

    from semrl.config.load import method_sections

    checked = 0
    for section, cls in method_sections().items():
        for f in dataclasses.fields(cls):
            valid = f.metadata.get("range")
            if valid is None or valid.low is None:
                continue
            bad = valid.low if valid.low_open else valid.low - 1
            if f.default is dataclasses.MISSING and isinstance(f.default_factory(), list):
                bad = [bad]
            with pytest.raises(ConfigError, match=rf"config key '{section}\.{f.name}' must be"):
                cls(**{f.name: bad})
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize(("key", "valid", "annotation"), list(_ranged_options()), ids=lambda v: str(v)[:40])
def test_each_range_is_checked_with_a_message_naming_the_key(key, valid, annotation, capsys):
    """A value just outside the range fails with the key and the range in the message; the bounds
    themselves pass when closed."""
    integer = "int" in str(annotation) and "float" not in str(annotation)
    step = 1 if integer else 0.5
    outside = []
    if valid.low is not None:
        outside.append(valid.low if valid.low_open else valid.low - step)
    if valid.high is not None:
        outside.append(valid.high if valid.high_open else valid.high + step)
    method = (
        key.split(".")[0]
        if key.split(".")[0] not in {"model", "data", "rollout", "reward", "algorithm", "trainer", "logging"}
        else None
    )
    base = [f"algorithm.method={method}"] if method else []
    listed = "list" in str(annotation)
    if not outside:  # any finite number: infinity is refused
        outside = [float("inf")]
    for value in outside:
        if integer:
            value = int(value)
        text = ".inf" if value == float("inf") else str(value)
        text = f"[{text}]" if listed else text
        with pytest.raises(
            ConfigError, match=rf"config key '{re.escape(key)}' must be .*got {re.escape(repr(value))}"
        ):
            load_config(None, [*base, f"{key}={text}"])
        # the command line too: `semrl config --check` exits 2 naming the key, and loads no model
        assert main(["config", "--check", "demo", *base, f"{key}={text}"]) == 2
        assert f"config key '{key}' must be" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.group_size=1", "must be >= 2, got 1: every method's advantage compares a response"),
        ("rollout.temperature=0", "must be > 0, got 0.0: greedy sampling (0) gives a prompt's G"),
        ("rollout.top_k=1", "rollout.top_k' is 1"),
        ("reward.weights=[0]", "reward.weights' is [0.0]"),
    ],
)
def test_configs_that_cannot_learn_are_refused_before_anything_loads(override, message, tmp_path, capsys):
    """One response per prompt, or greedy rollouts, give every group-relative advantage 0: refused by
    load_config and by `semrl config --check` (exit 2), with no run directory written."""
    from semrl.cli import main

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [override])
    config = tmp_path / "c.yaml"
    config.write_text(f"logging:\n  output_dir: {tmp_path / 'run'}\n")
    assert main(["config", "--check", str(config), override]) == 2
    assert message in capsys.readouterr().err
    assert main(["train", "--config", str(config), override]) == 2
    assert not (tmp_path / "run").exists()
    load_config(
        None, ["rollout.temperature=0.6", "logging.eval_temperature=0"]
    )  # a greedy evaluation is fine


@pytest.mark.parametrize(
    "content, message",
    [
        (b"- a\n- b\n", "holds a list, not a mapping"),
        (b"just a string\n", "holds a str, not a mapping"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "is not text"),
        (b"", "is empty"),
        (b"# only a comment\n\n", "is empty"),
    ],
)
def test_a_config_file_that_is_not_a_mapping_is_named_with_the_fix(content, message, tmp_path, capsys):
    from semrl.cli import main

    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        load_config(str(path), [])
    assert main(["config", "--check", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err
    # the repository's own rules file, given by mistake, says where it belongs
    from pathlib import Path

    rules = Path(__file__).parents[2] / "configs" / "study" / "study_sparse_rules.yaml"
    with pytest.raises(ConfigError, match="semrl compare --decide"):
        load_config(str(rules), [])


def test_the_reference_gives_every_literal_key_its_allowed_values():
    import typing

    from semrl.config.load import core_sections, method_sections

    rows = [row for row in config_reference().split("### Methods")[0].splitlines() if row.startswith("| `")]
    types = [row.split(" | ")[1] for row in rows]
    assert len(types) > 140
    assert not [t for t in types if "Literal" in t or "Optional" in t or "typing" in t]
    for name, cls in [*core_sections().items(), *method_sections().items()]:
        for key, tp in typing.get_type_hints(cls).items():
            literal = [a for a in (tp, *typing.get_args(tp)) if typing.get_origin(a) is typing.Literal]
            if literal:
                row = next(r for r in config_reference().splitlines() if r.startswith(f"| `{name}.{key}` |"))
                assert all(repr(c) in row for c in typing.get_args(literal[0])), row


@pytest.mark.e2e  # starts a process
def test_a_closed_pipe_ends_the_output_quietly():
    """`semrl config | head -3` prints three lines and no BrokenPipeError traceback."""
    import subprocess
    import sys

    out = subprocess.run(
        f"{sys.executable} -m semrl config | head -3", shell=True, capture_output=True, text=True, timeout=60
    )
    assert len(out.stdout.splitlines()) == 3
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


def test_config_lists_the_sections_asked_for_and_refuses_unknown_ones(capsys):
    from semrl.cli import main

    assert main(["config", "rollout"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| `")]
    assert rows and all(r.startswith("| `rollout.") for r in rows)
    assert main(["config", "rolout"]) == 2
    assert "Did you mean 'rollout'?" in capsys.readouterr().err
    assert main(["config", "trainer.lr=1"]) == 2
    assert "semrl config --check FILE trainer.lr=1" in capsys.readouterr().err


def test_missing_run_directories_are_named_before_anything_heavy_loads(tmp_path, capsys):
    from semrl.cli import main

    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert "no run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["train", "--resume", str(tmp_path / "empty")]) == 2
    assert "not a semrl run directory" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nope")]) == 2
    assert "no run directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides, inert",
    [
        (["algorithm.method=sent"], "sent.kl_target=old_abs"),
        (["algorithm.method=kl_cov"], "kl_cov.ppo_kl_coef=1.0"),
        (["algorithm.method=dapo", "algorithm.clip_ratio_high=0.28"], "algorithm.clip_ratio_high=0.28"),
    ],
)
def test_an_option_that_cannot_act_on_policy_is_said_loudly(overrides, inert, caplog):
    """SENT's |logp - old logp| penalty, KL-Cov's and clip-higher are identically 0 (never reached)
    when the update is purely on-policy: a warning names the option and the keys that make it act;
    with two mini-batches, two epochs, or SENT's k3 to the reference, none."""
    import logging

    with caplog.at_level(logging.WARNING, logger="semrl"):
        load_config(None, overrides)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and inert in warned[0] and "trainer.mini_batch_size below" in warned[0], warned
    for acting in (["trainer.mini_batch_size=32"], ["trainer.ppo_epochs=2"]):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="semrl"):
            load_config(None, [*overrides, *acting])
        assert not caplog.records, acting
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="semrl"):
        load_config(None, ["algorithm.method=sent", "sent.kl_target=ref_k3", "algorithm.kl_coef=0.01"])
        load_config(None, ["algorithm.method=grpo"])
    assert not caplog.records


def test_no_packaged_config_has_an_option_that_cannot_act(caplog):
    import logging

    from semrl.config.files import packaged_configs

    for name in packaged_configs():
        with caplog.at_level(logging.WARNING, logger="semrl"):
            load_config(name)
        assert not caplog.records, (name, caplog.text)


def test_an_unknown_method_names_the_key_the_closest_method_and_the_others():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.method=rosee"])
    assert str(err.value).startswith(
        "config key 'algorithm.method': unknown method 'rosee'. Did you mean 'rose'? Available: "
    )
    assert "dr_grpo" in str(err.value) and "treepo" in str(err.value)


def test_did_you_mean_names_the_closest_entry_with_its_prefix_or_nothing() -> None:
    from semrl.errors import closest, did_you_mean

    assert did_you_mean("lrr", ["seed", "lr", "steps"]) == " Did you mean 'lr'?"
    assert did_you_mean("lrr", ["lr"], prefix="trainer.") == " Did you mean 'trainer.lr'?"
    assert did_you_mean("temprature", ("temperature", "top_p")) == " Did you mean 'temperature'?"
    assert did_you_mean("zzz", ["seed", "lr"]) == ""
    assert closest("lr", ["seed"]) is None
    # the cutoff is difflib's ratio: 'gpo' is 0.86 from 'grpo', close at 0.8 and not at 0.9
    assert closest("gpo", ["grpo"], cutoff=0.8) == "grpo" and closest("gpo", ["grpo"], cutoff=0.9) is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.train={tmp}/missing.jsonl", "missing.jsonl"),
        ("data.eval={tmp}/no_answer.jsonl", "missing required field(s) ['answer']"),
        ("data.train={tmp}/no_answer.jsonl", "no_answer.jsonl line 1"),
        ("reward.functions=[math, {tmp}/missing_reward.py:score]", "missing_reward.py"),
    ],
)
def test_config_check_refuses_what_training_would(override, message, tmp_path, capsys):
    """`semrl config --check` reads the problems and imports the reward functions as `semrl train`
    does before any model (exit 2, the file named); `semrl train` refuses them before it writes a run
    directory."""
    (tmp_path / "no_answer.jsonl").write_text('{"problem": "What is 1 + 1?", "final": "2"}\n')
    override = override.format(tmp=tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(f"logging:\n  output_dir: {tmp_path / 'run'}\n")
    assert main(["config", "--check", str(config), override]) == 2
    assert message in capsys.readouterr().err
    assert main(["train", "--config", str(config), override]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_each_run_gets_a_directory_of_its_own_unless_one_is_named(tmp_path, monkeypatch):
    """logging.output_dir: auto (the default, and no packaged run config sets one) is
    runs/CONFIG-YYYYMMDD-HHMMSS, numbered on when taken; a named directory wins; nothing is created."""
    from datetime import datetime

    from semrl.config.load import fresh_run_dir

    monkeypatch.chdir(tmp_path)
    before = datetime.now().replace(microsecond=0)
    made = load_config("demo").logging.output_dir
    stamp = re.fullmatch(r"runs/demo-(\d{8}-\d{6})", made)
    assert stamp and before <= datetime.strptime(stamp.group(1), "%Y%m%d-%H%M%S") <= datetime.now()
    assert not (tmp_path / "runs").exists()
    assert re.fullmatch(r"runs/rose_demo-\d{8}-\d{6}", load_config("rose_demo").logging.output_dir)
    assert re.fullmatch(
        r"runs/grpo-\d{8}-\d{6}", load_config(None, ["algorithm.method=grpo"]).logging.output_dir
    )
    assert re.fullmatch(
        r"runs/demo-\d{8}-\d{6}", load_config("demo", ["logging.output_dir=auto"]).logging.output_dir
    )
    assert load_config("demo", ["logging.output_dir=mine"]).logging.output_dir == "mine"
    now = datetime(2026, 11, 28, 1, 2, 3)
    assert fresh_run_dir("demo", now=now) == "runs/demo-20261128-010203"
    (tmp_path / "runs" / "demo-20261128-010203").mkdir(parents=True)
    assert fresh_run_dir("demo", now=now) == "runs/demo-20261128-010203-2"
    (tmp_path / "runs" / "demo-20261128-010203-2").mkdir()
    assert fresh_run_dir("demo", now=now) == "runs/demo-20261128-010203-3"
    assert fresh_run_dir("demo", tmp_path / "elsewhere", now) == str(
        tmp_path / "elsewhere" / "demo-20261128-010203"
    )


def test_the_processes_of_one_run_share_the_directory_chosen_once(tmp_path, monkeypatch):
    """semrl train --num-processes N picks the time-stamped directory in the launcher and hands it to
    every process (each would otherwise read its own clock)."""
    import subprocess

    launched = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subprocess, "call", lambda command: launched.append(command) or 0)
    assert main(["train", "--num-processes", "2", "--config", "demo", "trainer.steps=1"]) == 0
    (command,) = launched
    dirs = [arg for arg in command if arg.startswith("logging.output_dir=")]
    assert len(dirs) == 1 and re.fullmatch(r"logging\.output_dir=runs/demo-\d{8}-\d{6}", dirs[0])
    assert command[-2:] == ["trainer.steps=1", dirs[0]]


def test_fsdp_on_vllm_refuses_a_rollout_that_needs_an_entropy_forward():
    """Only where vLLM's sampler does not record the entropy (rollout.vllm_sampler_entropy=false):
    by default it does, and no forward runs."""
    fsdp_vllm = ["trainer.fsdp=true", "rollout.engine=vllm", "rollout.vllm_sampler_entropy=false"]
    cases = [
        ("rose", "rose.entropy_mode=full_vocab", "rose.entropy_mode=topk_logprobs"),
        ("fr3e", "fr3e.anchor_metric=entropy", "fr3e.anchor_metric=surprisal"),
    ]
    from tests.helpers import vllm_or_skip

    vllm_or_skip()  # installed, not imported: the config's checks need no engine
    for method, needs, fine in cases:
        with pytest.raises(ConfigError, match=f"cannot run a forward pass for entropies \\({needs}\\)"):
            load_config(None, [f"algorithm.method={method}", needs, *fsdp_vllm])
        load_config(None, [f"algorithm.method={method}", fine, *fsdp_vllm])
        load_config(None, [f"algorithm.method={method}", needs, "trainer.fsdp=true"])  # hf: the forward runs
        load_config(None, [f"algorithm.method={method}", needs, *fsdp_vllm[:2]])  # the sampler records it


def test_a_renamed_option_reads_its_old_name_with_a_warning_and_refuses_both(tmp_path):
    """``latr.vllm_lookahead`` became ``latr.lookahead_on``: a config, an override or a saved run that
    uses the old name loads to the same value, says so, and the reference names the old key."""
    base = ["algorithm.method=latr"]
    with pytest.warns(FutureWarning, match=r"'latr\.vllm_lookahead' is now 'latr\.lookahead_on'"):
        old = load_config(None, [*base, "latr.vllm_lookahead=model"])
    assert old.section("latr").lookahead_on == "model"
    saved = tmp_path / "config.yaml"
    saved.write_text("algorithm:\n  method: latr\nlatr:\n  vllm_lookahead: model\n")
    with pytest.warns(FutureWarning):
        assert load_config(saved).section("latr").lookahead_on == "model"
    with pytest.raises(ConfigError, match=r"'latr\.vllm_lookahead' and 'latr\.lookahead_on' are the same"):
        load_config(None, [*base, "latr.vllm_lookahead=model", "latr.lookahead_on=stream"])
    assert "Formerly `latr.vllm_lookahead`" in config_reference(["latr"])
