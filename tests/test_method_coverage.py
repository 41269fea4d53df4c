"""Every registered method is trained, resumed, packed, golden-run and explored by the tests and
benchmarks, with no list kept by hand: each list is the catalog's (``tests.helpers.every_method``,
``semrl.methods.catalog.tree_methods``), so a method registered tomorrow is covered the day it lands.
What a person must write for a new method is checked too: its row of tiny-run settings
(``tests.method_runs``) and its documentation (a page of its own, required of a tree method, or a row
of docs/methods/baselines.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from semrl.methods.catalog import METHODS, tree_methods
from semrl.methods.registry import MethodSpec, register_method
from tests.helpers import every_method, method_of
from tests.method_runs import TINY_RUN_SETTINGS
from tests.runtime.test_resume_methods import METHODS as RESUMED
from tests.update.test_packing import PACKED_METHODS

ROOT = Path(__file__).parents[1]


def _golden_runs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("golden_runs", ROOT / "benchmarks" / "golden_runs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gaps(
    registered: list[str], trees: list[str], lists: dict[str, dict[str, list[str]]], packed: list[str]
) -> dict[str, list[str]]:
    """Per list, the registered methods it never runs (the tree methods for packing)."""
    gaps = {
        kind: sorted(set(registered) - {method_of(o) for o in runs.values()}) for kind, runs in lists.items()
    }
    gaps["packing"] = sorted(set(trees) - set(packed))
    return {kind: missing for kind, missing in gaps.items() if missing}


def test_every_registered_method_is_trained_resumed_packed_golden_run_and_explored():
    registered, trees = list(METHODS), tree_methods()
    assert {"rose", "treepo", "latr", "fr3e"} <= set(trees) and "grpo" not in trees
    lists = {"training and resume": RESUMED, "golden runs": _golden_runs().RUNS}
    assert not _gaps(registered, trees, lists, PACKED_METHODS)


def _unwritten(registered: list[str], trees: list[str]) -> dict[str, list[str]]:
    """Per thing a new method needs written, the registered methods that lack it."""
    pages = {name for name in registered if (ROOT / "docs" / "methods" / f"{name}.md").exists()}
    baselines = (ROOT / "docs" / "methods" / "baselines.md").read_text()
    in_baselines = {name for name in registered if f"| `{name}`" in baselines}
    tabled = {method_of(overrides) for overrides in TINY_RUN_SETTINGS.values()}
    gaps = {
        "tiny-run settings (tests/method_runs.py)": sorted(set(registered) - tabled),
        "a page, or a row of docs/methods/baselines.md": sorted(set(registered) - pages - in_baselines),
        "a page of its own (a tree method)": sorted(set(trees) - pages),
    }
    return {kind: missing for kind, missing in gaps.items() if missing}


def test_every_registered_method_has_its_tiny_run_settings_and_its_documentation():
    assert not _unwritten(list(METHODS), tree_methods())
    assert {"rose", "sent", "treepo", "latr", "fr3e"} <= {
        p.stem for p in (ROOT / "docs" / "methods").glob("*.md")
    }


def test_a_method_registered_without_settings_or_documentation_is_named(new_tree_method):
    assert _unwritten(list(METHODS), tree_methods()) == {
        "tiny-run settings (tests/method_runs.py)": [new_tree_method],
        "a page, or a row of docs/methods/baselines.md": [new_tree_method],
        "a page of its own (a tree method)": [new_tree_method],
    }


@pytest.fixture
def new_tree_method():
    """A tree method registered after the lists were made, as a plug-in or a new folder would be."""
    spec = MethodSpec(
        name="coverage_probe",
        advantage_fn="semrl.methods.advantages:outcome_advantages",
        description="a probe of the coverage lists",
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        rollout_fn="semrl.methods.rose.method:rose_rollout",
    )
    register_method(spec)
    yield spec.name
    METHODS.pop(spec.name)


def test_a_method_registered_later_is_in_every_list(new_tree_method):
    """Lists made from the catalog take a new method in; the gap check names it where a list is
    kept by hand."""
    golden = _golden_runs().RUNS  # made now, with the probe registered
    lists = {"training and resume": every_method(RESUMED), "golden runs": golden}
    packed = ["grpo", "dr_grpo", *tree_methods()]
    assert new_tree_method in tree_methods()
    assert not _gaps(list(METHODS), tree_methods(), lists, packed)
    # the same check on the lists as they were before it registered
    stale = _gaps(list(METHODS), tree_methods(), {"training and resume": RESUMED}, PACKED_METHODS)
    assert stale == {"training and resume": [new_tree_method], "packing": [new_tree_method]}


def test_a_run_of_an_unregistered_method_is_refused():
    with pytest.raises(ValueError, match="not registered"):
        every_method({"typo": ["algorithm.method=rsoe"]})
