"""The command line's answers to a new user's mistakes: missing paths, typed options, packaged configs
by name, and the config reference at a terminal's width."""

from __future__ import annotations

import time

import pytest

from semrl.cli import main
from semrl.config.load import config_reference
from tests.helpers import cli_in_fresh_process, tiny_run_overrides

MISSING = [
    (["eval", "--model", "/nonexistent"], "model '/nonexistent' is neither the alias"),
    (["eval", "--model", "/nonexistent.gguf"], "GGUF file '/nonexistent.gguf' does not exist"),
    (
        ["eval", "--data", "/nonexistent.jsonl"],
        "dataset '/nonexistent.jsonl' is neither a packaged benchmark",
    ),
    (["eval", "--data", "nosuchbench"], "dataset 'nosuchbench' is neither a packaged benchmark"),
    (
        ["curriculum", "score", "--model", "/nonexistent", "--output", "x.jsonl"],
        "model '/nonexistent' is neither",
    ),
    (["train", "--config", "/nonexistent.yaml"], "config file '/nonexistent.yaml' does not exist"),
    (["train", "--resume", "/nonexistent"], "no run directory '/nonexistent'"),
    (["export", "/nonexistent"], "no run directory '/nonexistent'"),
    (["checkpoint", "verify", "/nonexistent"], "no run directory '/nonexistent'"),
    (["compare", "/nonexistent"], "'/nonexistent' does not exist"),
    (
        ["compare", "results/study_arith", "--decide", "/nonexistent.yaml"],
        "rules file '/nonexistent.yaml' does not",
    ),
    (["sweep", "/nonexistent.yaml"], "sweep file '/nonexistent.yaml' does not exist"),
    (["report", "/nonexistent"], "does not exist"),
    (["config", "--check", "/nonexistent.yaml"], "config file '/nonexistent.yaml' does not exist"),
]


@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize("argv, words", MISSING, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_missing_path_is_named_before_torch_loads(argv, words):
    """Exit 2 with the path named, from a fresh interpreter, with torch never imported and in under
    a second (the better of two tries, so that one slow start on a loaded machine does not decide)."""
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        code, modules, stderr = cli_in_fresh_process(argv)
        seconds.append(time.perf_counter() - start)
        assert code == 2 and words in stderr, stderr
        assert "torch" not in modules and "datasets" not in modules
    assert min(seconds) < 1.0, seconds


@pytest.mark.parametrize(
    "argv, meant",
    [
        (["train", "--confg", "demo"], "Did you mean '--config'?"),
        (["config", "--chek", "demo"], "Did you mean '--check'?"),
        (["eval", "--modle", "x", "--limt", "3"], "'--model' for '--modle', '--limit' for '--limt'"),
        (["compare", "x", "--zzz"], "see 'semrl compare --help'"),
    ],
)
def test_a_mistyped_option_gets_the_option_it_meant(argv, meant, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "unrecognized arguments" in err and meant in err, err


def test_packaged_configs_are_found_by_name_from_any_directory(tmp_path, monkeypatch, capsys):
    """`--config demo` outside a clone: the wheel's semrl/configs/demo.yaml; a near miss is named."""
    from semrl.config.files import config_file, packaged_configs

    monkeypatch.chdir(tmp_path)
    names = packaged_configs()
    assert {"demo", "rose_demo", "sent_demo", "treepo_demo", "latr_demo", "fr3e_demo", "dapo_demo"} <= set(
        names
    )
    assert not [n for n in names if n.startswith("study")]  # sweeps are not run configs
    for name in names:
        if name == "sent_demo":  # its curriculum file is made first by 'semrl curriculum score'
            assert main(["config", "--check", name]) == 2
            assert "runs/curriculum/arithmetic_l1.jsonl" in capsys.readouterr().err
        else:
            assert main(["config", "--check", name]) == 0, name
        assert config_file(f"{name}.yaml").name == f"{name}.yaml"
    (tmp_path / "demo").mkdir()  # a directory of that name does not hide the packaged config
    assert main(["config", "--check", "demo"]) == 0
    assert main(["config", "--check", "dmeo"]) == 2
    err = capsys.readouterr().err
    assert "Did you mean 'demo'?" in err and "rose_paper" in err
    assert main(["config", "--check", "nothere/demo.yaml"]) == 2  # a path is a path


def test_config_check_takes_the_file_as_check_or_as_config(capsys):
    assert main(["config", "--check", "--config", "demo", "trainer.steps=3"]) == 0
    assert main(["config", "--config", "demo"]) == 0
    assert "demo: OK (method dr_grpo)" in capsys.readouterr().out
    assert main(["config", "--check"]) == 2
    assert "--check needs a config file" in capsys.readouterr().err
    assert main(["config", "--check", "demo", "--config", "rose_demo"]) == 2


def test_the_reference_fits_a_terminal_and_lists_sections():
    """At a terminal's width every line fits; a section list gives those sections only; Markdown
    (the docs page, a pipe) has one table per section."""
    for width in (60, 80, 100):
        text = config_reference(width=width)
        assert max(len(line) for line in text.splitlines()) <= width
        assert "rollout.group_size = 8  (int)" in text and "rose.epsilon" in text
    only = config_reference(["rollout", "rose"], width=80)
    keys = [
        line.split()[0] for line in only.splitlines() if line.startswith("  ") and not line.startswith("   ")
    ]
    assert keys and {k.split(".")[0] for k in keys} == {"rollout", "rose"}
    markdown = config_reference()
    assert markdown.count("| key | type | default | meaning |") == markdown.count("### `") >= 16
    with pytest.raises(Exception, match="Did you mean 'rollout'"):
        config_reference(["rolout"])


def test_semrl_eval_names_its_default_output_after_the_run_of_a_checkpoint():
    from semrl.cli.evaluate import default_output_name

    assert default_output_name("runs/A/checkpoints/step-000010") == "A-step-000010"
    assert default_output_name("runs/B/checkpoints/step-000010") == "B-step-000010"
    assert default_output_name("smollm2") == "smollm2"
    assert default_output_name("/models/my-model") == "my-model"


def test_semrl_eval_of_a_checkpoint_given_from_inside_its_run_is_named_after_the_run(
    digit_model_dir, seven_task, tmp_path, monkeypatch
):
    """The command as a user types it in a run directory: ``semrl eval --model checkpoints/step-N``
    writes to runs/eval/RUN-step-N there, not to runs/eval/step-N, which every run's step N shares."""
    run = tmp_path / "lr-high"
    overrides = tiny_run_overrides(digit_model_dir, seven_task, run, "trainer.steps=1")
    assert main(["train", "--config", "demo", *overrides]) == 0
    monkeypatch.chdir(run)
    args = ["--data", str(seven_task), "--n", "1", "--limit", "2", "--max-new-tokens", "2", "--quiet"]
    assert main(["eval", "--model", "checkpoints/step-000001", *args]) == 0
    assert (run / "runs" / "eval" / "lr-high-step-000001" / "results.md").is_file()
    assert not (run / "runs" / "eval" / "step-000001").exists()
