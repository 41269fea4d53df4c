"""Adding a method is adding one module: a toy method with options, checks, state and its own
rollout, loaded as a plugin, configured, listed and trained (README, "Adding a method")."""

from __future__ import annotations

import ast
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import DIGIT_SYSTEM_PROMPT

TOY_MODULE = textwrap.dedent(
    '''
    """Toy: GRPO advantages times ``toy.scale``, sampled through the method's own rollout."""

    from dataclasses import dataclass

    from semrl.methods.advantages import outcome_advantages
    from semrl.methods.interface import MethodRollout
    from semrl.methods.registry import MethodSpec, register_method
    from semrl.rollout.batch import GroupInfo
    from semrl.errors import ConfigError
    from semrl.config.options import option
    from semrl.rollout.engines import GenerationRequest


    @dataclass(frozen=True)
    class ToyConfig:
        scale: float = option(1.0, "Toy: advantages are multiplied by this.")

        def __post_init__(self):
            if self.scale <= 0:
                raise ConfigError(f"config key 'toy.scale' must be > 0, got {self.scale}")


    def check_toy(cfg):
        assert cfg.section("toy").scale > 0
        if cfg.rollout.group_size < 2:
            raise ConfigError("toy needs rollout.group_size >= 2")


    @dataclass
    class ToyState:
        rollouts: int = 0


    def toy_rollout(ctx, prompt_ids):
        ctx.state.rollouts += 1
        requests = [GenerationRequest(ids) for ids in prompt_ids for _ in range(ctx.group_size)]
        gens = ctx.engine.generate(requests, ctx.params, ctx.generator)
        groups = [GroupInfo(method_data=p) for p in range(len(prompt_ids))]
        return MethodRollout(gens, groups=groups, metrics={"toy/rollout_calls": float(ctx.state.rollouts)})


    def toy_advantages(inputs, config):
        assert [g.method_data for g in inputs.groups] == list(range(len(inputs.groups)))
        assert isinstance(config.options, ToyConfig) and not hasattr(config, "trainer")
        adv, _ = outcome_advantages(inputs, config)
        return adv * config.options.scale, {"toy/scale": config.options.scale}


    register_method(MethodSpec(
        name="toy", advantage_fn=toy_advantages, description="Toy: scaled GRPO advantages.",
        norm_adv_by_std=True, loss_agg_mode="token-mean", rollout_fn=toy_rollout,
        options=ToyConfig, check=check_toy, new_state=ToyState,
    ))
    '''
)


def _plugin_run(model_dir, task, out, *extra):  # noqa: ANN001, ANN202
    """A 2-step run of a plug-in method on the digit model: 2 prompts x 4 samples."""
    from semrl.config.load import load_config

    return load_config(
        None,
        [
            f"model.name={model_dir}",
            f"data.train={task}",
            "data.eval=null",
            f"data.system_prompt={DIGIT_SYSTEM_PROMPT}",
            "rollout.group_size=4",
            "rollout.prompts_per_step=2",
            "trainer.steps=2",
            "reward.num_workers=1",
            "logging.progress=false",
            f"logging.output_dir={out}",
            *extra,
        ],
    )


@pytest.fixture
def toy_plugin(tmp_path):
    from semrl.methods.catalog import METHODS, load_plugins

    path = tmp_path / "toy_method.py"
    path.write_text(TOY_MODULE)
    load_plugins([str(path)])
    yield path
    METHODS.pop("toy", None)
    sys.modules.pop("semrl_plugin_toy_method", None)


def test_a_plugin_method_is_configured_listed_and_checked(toy_plugin, capsys):
    from semrl.cli import main
    from semrl.config.load import config_reference, load_config
    from semrl.config.sections import ConfigError

    cfg = load_config(None, ["algorithm.method=toy", "toy.scale=0.5"])
    assert cfg.section("toy").scale == 0.5 and cfg.algorithm.loss_agg_mode == "token-mean"
    assert "`toy.scale`" in config_reference()
    with pytest.raises(ConfigError, match="Did you mean 'toy.scale'"):
        load_config(None, ["algorithm.method=toy", "toy.scal=2"])
    with pytest.raises(ConfigError, match="toy.scale' must be > 0"):
        load_config(None, ["algorithm.method=toy", "toy.scale=-1"])
    with pytest.raises(ConfigError, match="group_size' must be >= 2"):
        load_config(None, ["algorithm.method=toy", "rollout.group_size=1"])
    assert main(["config", "--plugin", str(toy_plugin), "--methods"]) == 0
    assert "| `toy` |" in capsys.readouterr().out


def test_a_missing_plugin_fails_clearly(capsys):
    from semrl.cli import main

    assert main(["config", "--plugin", "no/such/file.py", "--methods"]) == 2
    assert "plugin 'no/such/file.py' does not exist" in capsys.readouterr().err


def test_a_plugin_method_trains_with_its_state_and_metrics(toy_plugin, digit_model_dir, seven_task, tmp_path):
    from semrl.runtime.trainer import Trainer

    out = tmp_path / "run"
    cfg = _plugin_run(
        digit_model_dir, seven_task, out, "rollout.max_new_tokens=4", "algorithm.method=toy", "toy.scale=0.5"
    )
    Trainer(cfg).train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["toy/rollout_calls"] for r in rows] == [1.0, 2.0]  # the method's state lives across steps
    assert all(r["toy/scale"] == 0.5 for r in rows)


def test_a_seam_function_with_the_wrong_signature_fails_when_loaded():
    """load checks a function against the arguments its seam passes: too few or too many required
    positional parameters fail with the seam named and what it is called with; defaults, *args and a
    'module:function' reference that fits pass."""
    from semrl.errors import ConfigError
    from semrl.methods.registry import load

    def one(ctx):  # noqa: ANN001, ANN202
        return ctx

    def three(ctx, prompt_ids, extra):  # noqa: ANN001, ANN202
        return ctx

    for wrong in (one, three):
        with pytest.raises(ConfigError, match=r"method toy's rollout_fn is called as f\(ctx, prompt_ids\)"):
            load(wrong, ("ctx", "prompt_ids"), "method toy's rollout_fn")
    assert load(lambda ctx, prompt_ids, extra=None: 0, ("ctx", "prompt_ids"))
    assert load(lambda *args: 0, ("ctx", "prompt_ids"))
    rose = load("semrl.methods.rose.method:rose_rollout", ("ctx", "prompt_ids"), "method rose's rollout_fn")
    assert rose.__name__ == "rose_rollout"


def _adding_page_files() -> dict[str, str]:
    """The files of docs/methods/adding.md's tree method, by the path each block's first line names."""
    page = (Path(__file__).parents[2] / "docs" / "methods" / "adding.md").read_text()
    blocks = re.findall(r"```python\n# (my_tree/[\w.]+?):[^\n]*\n(.*?)```", page, re.S)
    return dict(blocks)


@pytest.fixture
def tree_plugin(tmp_path, monkeypatch):
    from semrl.methods.catalog import METHODS, load_plugins

    files = _adding_page_files()
    assert sorted(files) == ["my_tree/__init__.py", "my_tree/rollout.py"]
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    load_plugins(["my_tree"])
    yield
    METHODS.pop("my_tree", None)
    for module in ("my_tree", "my_tree.rollout"):
        sys.modules.pop(module, None)


def test_the_tree_method_of_the_adding_page_trains(tree_plugin, digit_model_dir, seven_task, tmp_path):
    """The page's tree method on the kit: its options import no torch, and it trains; each group is
    a chain and children that share its first tokens."""
    from semrl.methods.catalog import tree_methods
    from semrl.runtime.trainer import Trainer

    # its options import only torch-free modules (tests/test_architecture.py checks these two)
    options = ast.parse(_adding_page_files()["my_tree/__init__.py"])
    imported = {n.module for n in ast.walk(options) if isinstance(n, ast.ImportFrom)}
    assert imported == {"dataclasses", "semrl.config.options", "semrl.methods.registry"}
    assert "my_tree" in tree_methods()
    out = tmp_path / "run"
    cfg = _plugin_run(
        digit_model_dir,
        seven_task,
        out,
        "rollout.max_new_tokens=6",
        "algorithm.method=my_tree",
        "my_tree.fraction=0.5",
    )
    Trainer(cfg).train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    trees = [json.loads(line) for line in (out / "trees.jsonl").read_text().splitlines()]
    assert trees
    for tree in trees:  # chain 0, then children that continue it from where they branch
        chains = tree["chains"]
        assert chains[0]["parent"] == -1 and len(chains) == 4
        for child in chains[1:]:
            assert child["parent"] in (-1, 0)
            assert child["parent"] == 0 or child["branch_position"] == 0
            assert child["branch_position"] == min(chains[0]["length"] // 2, chains[0]["length"] - 1) or (
                child["parent"] == -1
            )
