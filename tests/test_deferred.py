"""semrl.deferred: an import inside the block binds a stand-in; the first attribute read runs the real
module once; ``resolve`` leaves only real modules in the globals of what the block imported.

The modules are written to a temporary directory, so each test sees them unimported; each records
how often its body ran."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from semrl.deferred import DeferredModule, deferred_imports


@pytest.fixture
def modules(tmp_path: Path, request: pytest.FixtureRequest):
    """A heavy module (counts its runs in a list of the ``counter`` module) and a light one that
    imports it at the top the way method modules import torch."""
    tag = request.node.name.replace("[", "_").replace("]", "_").replace("-", "_")
    heavy, light, counter = f"heavy_{tag}", f"light_{tag}", f"counter_{tag}"
    (tmp_path / f"{counter}.py").write_text("RUNS = []\n")
    (tmp_path / f"{heavy}.py").write_text(
        f"import {counter}\n{counter}.RUNS.append(1)\nVALUE = 42\n\ndef double(x):\n    return 2 * x\n"
    )
    (tmp_path / f"{light}.py").write_text(
        f"import {heavy}\nimport {heavy} as alias\n\ndef use():\n    return {heavy}.double({heavy}.VALUE)\n"
    )
    sys.path.insert(0, str(tmp_path))
    yield heavy, light, importlib.import_module(counter)
    sys.path.remove(str(tmp_path))
    for name in (heavy, light, counter):
        sys.modules.pop(name, None)


def test_an_import_in_the_block_runs_nothing_until_an_attribute_is_read(modules):
    heavy, light, counter = modules
    with deferred_imports(heavy):
        module = importlib.import_module(light)
        assert counter.RUNS == [], "the deferred module ran at import"
        assert isinstance(getattr(module, heavy), DeferredModule)
        assert module.use() == 84  # the first attribute read imports it
        assert counter.RUNS == [1]
        assert module.use() == 84 and module.alias.VALUE == 42
    assert counter.RUNS == [1], "the module ran twice"
    assert sys.modules[heavy] is not getattr(module, heavy)
    assert sys.modules[heavy].VALUE == 42 and counter.RUNS == [1]


def test_leaving_the_block_unread_leaves_no_stand_in_and_imports_nothing(modules):
    heavy, light, counter = modules
    with deferred_imports(heavy) as deferral:
        module = importlib.import_module(light)
    assert heavy not in sys.modules and counter.RUNS == []
    assert set(deferral.stand_ins) == {heavy}
    assert module.use() == 84 and counter.RUNS == [1]  # a stand-in kept past the block still works
    real = importlib.import_module(heavy)
    assert real.VALUE == 42 and counter.RUNS == [1]


@pytest.mark.parametrize("read_first", [False, True])
def test_resolve_rebinds_every_global_to_the_real_module(modules, read_first):
    heavy, light, counter = modules
    with deferred_imports(heavy) as deferral:
        module = importlib.import_module(light)
        if read_first:
            assert module.use() == 84
    deferral.resolve()
    real = sys.modules[heavy]
    assert type(real) is types.ModuleType
    assert getattr(module, heavy) is real and module.alias is real
    assert module.use() == 84 and counter.RUNS == [1]


def test_modules_already_imported_are_not_deferred(modules):
    heavy, light, counter = modules
    real = importlib.import_module(heavy)
    with deferred_imports(heavy) as deferral:
        module = importlib.import_module(light)
    assert deferral.stand_ins == {}
    assert getattr(module, heavy) is real and counter.RUNS == [1]


def test_a_submodule_name_is_refused():
    with pytest.raises(ValueError, match="top-level"), deferred_imports("torch.nn"):
        pass


def test_torch_deferred_then_resolved_leaves_the_method_modules_with_real_torch():
    """The path of ``semrl train``: the catalog imported under the deferral, resolved, then every
    ``semrl`` module's ``torch`` and ``np`` are the real modules, and a method's tensor code runs."""
    program = textwrap.dedent(
        """
        import sys, types
        from semrl.deferred import DeferredModule, deferred_imports
        with deferred_imports("torch", "numpy") as deferral:
            import semrl.algos.catalog
            from semrl.configure import load_config
            cfg = load_config("configs/demo.yaml", ["algorithm.method=rose"])
        assert "torch" not in sys.modules, "torch loaded while the config was read"
        deferral.resolve()
        import numpy, torch
        stale = [
            f"{name}.{key}" for name, module in list(sys.modules.items()) if isinstance(module, types.ModuleType)
            for key, value in vars(module).items() if isinstance(value, DeferredModule)
        ]
        assert not stale, stale
        from semrl.algos import grpo, rose
        assert rose.torch is torch and grpo.torch is torch
        assert semrl.engines.base.np is numpy
        rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
        print(grpo.group_centered_rewards(rewards, torch.zeros(4, dtype=torch.long), False).tolist())
        """
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[0.25, -0.75, 0.25, 0.25]"
