"""Shared fixtures: a tiny randomly initialised Llama with SmolLM2's real tokenizer (its recipe in
tests/helpers.py), the digit-trained tiny models, the seven task; and the xdist groups."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from filelock import FileLock

# The suite's 2 xdist workers share 2 cores: one torch thread each, set before torch loads, and the
# processes the tests start inherit it (test_training and test_resume_methods took 112-113 s on
# 2 workers against 121-123 s with a thread per core, 2 pairs, 2026-11-29).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No full collection over the imports of torch, transformers and the tests while they load: the
# collector is held off until the first test, which finds what they keep frozen (pytest_runtestloop;
# semrl.core.collector, docs/benchmarks.md, "The collector's share").
from semrl.core.collector import imports_collected_once  # noqa: E402 (torch-free)

_IMPORTS = imports_collected_once()
_IMPORTS.__enter__()
# tests.helpers (torch) is imported by the fixtures that build, not here: the xdist controller, which
# runs no test, then starts its workers about 1.3 s sooner.

TINY_DIR_ENV = "SEMRL_TINY_MODEL"

# The suite runs on 2 pytest-xdist workers (pyproject's addopts, --dist loadgroup). The tests of a
# group run on one worker, one after another: vLLM starts once per process and keeps its engine for
# the next test (semrl.rollout.engines.vllm), and building the wheel and the sdist share build/.
SERIAL_GROUPS = {
    "vllm": {
        "rollout/test_engines.py",
        "evaluation/test_evaluation.py",
        "rollout/test_tree_driver.py",
        "rollout/test_tree_kit.py",
        "rollout/vllm/test_fork.py",
        "rollout/vllm/test_entropy.py",
    },
    # processes forked from one preloaded server that has imported vLLM (tests/forked.py), started once
    "vllm_processes": {"rollout/vllm/test_processes.py"},
    "build": {"test_packaging.py"},
    "error_rates": {"studies/test_error_rates.py"},  # one worker computes each design's levels once
}
TESTS = Path(__file__).parent


# A test is end-to-end (marker e2e) when it asks, directly or through another fixture, for a model or
# a pool of worker processes, or is marked e2e itself (a test that starts a process in its body);
# every other test is a unit test (marker unit), and the guard below fails one that starts a process
# or loads a pretrained model.
E2E_FIXTURES = {"tiny_model_dir", "tiny32_model_dir", "digit_model_dir", "digit32_model_dir", "pool", "pools"}


def _module_fixtures(item: pytest.Item) -> list[str]:
    """The module-scoped fixtures ``item`` uses that its own module defines (a run, a pool, a model)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope == "module" and defs[-1].baseid == item.nodeid.split("::")[0]
    ]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads xdist_group into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # a test outside these files joins a group with its own xdist_group marker
        for group, files in SERIAL_GROUPS.items():
            if item.path.relative_to(TESTS).as_posix() in files:
                item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("xdist_group") is None and _module_fixtures(item):
            # one worker builds the module's fixture once, instead of each worker building it again
            item.add_marker(
                pytest.mark.xdist_group(f"module-fixtures-{item.path.relative_to(TESTS).as_posix()}")
            )
        fixtures = set(getattr(item, "fixturenames", ()))
        marked = item.get_closest_marker("e2e") or item.get_closest_marker("slow")
        if not marked:
            item.add_marker(pytest.mark.e2e if fixtures & E2E_FIXTURES else pytest.mark.unit)
    # The end-to-end tests first (0.1-80 s each), the unit tests (mostly under 0.1 s) last: xdist hands
    # out the tests outside a group in this order, so the short ones fill the workers' last minute
    # instead of one worker running a long test alone (about 25 s of 11.6 min, one core idle).
    items.sort(key=lambda item: item.get_closest_marker("unit") is not None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Before the first test: the imports' and the collection's garbage collected once, what survives
    (modules, classes, the collected tests: all kept to the end) frozen, and the collector on again."""
    _IMPORTS.__exit__(None, None, None)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """An xdist worker ends here, once it has sent its results, without the interpreter's shutdown
    (vLLM's engine, the preloaded servers, torch's and vLLM's destructors): 4-10 s at the end of each
    run, which the master spent waiting for it. Its preloaded servers and reward workers' fork
    servers end when their pipes from it close."""
    if hasattr(config, "workerinput"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@pytest.fixture(autouse=True)
def _unit_tests_stay_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test that starts a process or loads a pretrained model fails, naming the fix."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            f"unit test {request.node.nodeid} starts a process or loads a model: mark it "
            "@pytest.mark.e2e (tests/conftest.py)"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    if "transformers" in sys.modules:  # loaded already: a test that reads pretrained weights
        monkeypatch.setattr(sys.modules["transformers"].PreTrainedModel, "from_pretrained", refuse)


def _vllm_uses() -> dict[str, int]:
    """How often this process has used vLLM so far, by the group that must hold such tests: requests
    to an engine in the process (``state.REQUEST_IDS``' next id) for "vllm", commands forked from the
    preloaded vLLM server (``tests.forked``) for "vllm_processes"."""
    state = sys.modules.get("semrl.rollout.engines.vllm.state")
    forked = sys.modules.get("tests.forked")
    return {
        "vllm": 0 if state is None else int(repr(state.REQUEST_IDS)[len("count(") : -1]),
        "vllm_processes": 0 if forked is None else forked.FORKS_ASKED["vllm"],
    }


@pytest.fixture(autouse=True)
def _vllm_tests_share_the_workers_engine(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that sends requests to a vLLM engine in the test process fails unless it is in the
    "vllm" group, and one that forks a command from the preloaded vLLM server unless it is in
    "vllm_processes": elsewhere it may land on the worker that has no engine (or server), which then
    starts its own (an engine: 8 s of the suite, 2026-12-07)."""
    before = _vllm_uses()
    yield
    marker = request.node.get_closest_marker("xdist_group")
    group = None if marker is None else (marker.args[0] if marker.args else marker.kwargs.get("name"))
    for needed, uses in _vllm_uses().items():
        if group != needed and uses > before[needed]:
            what = (
                "samples from a vLLM engine in the test process"
                if needed == "vllm"
                else "forks a command from the preloaded vLLM server"
            )
            pytest.fail(
                f"{request.node.nodeid} {what}: add it to the worker's one with "
                f'@pytest.mark.xdist_group("{needed}") (tests/conftest.py)',
                pytrace=False,
            )


def _built_once(build: Callable[[Path], Path], target: Path) -> Path:
    """``build(target)`` under a file lock: the first worker of the session builds, the others wait
    and find it built (each recipe returns early when its target exists)."""
    with FileLock(str(target) + ".lock"):
        return build(target)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """Where the tiny models are built, once per test session: the directory that the xdist workers'
    temporary directories share (or the one SEMRL_TINY_MODEL's path names)."""
    cached = os.environ.get(TINY_DIR_ENV)
    if cached:
        return Path(cached).parent
    base = tmp_path_factory.getbasetemp()
    return (base if worker_id == "master" else base.parent) / "models"


@pytest.fixture(scope="session")
def tiny_model_dir(models_dir: Path) -> Path:
    """A ~3.2M-parameter Llama (hidden 64, 2 layers) using the SmolLM2 tokenizer, with its
    derivatives below beside it."""
    from tests.helpers import build_tiny_model

    cached = os.environ.get(TINY_DIR_ENV)
    return _built_once(build_tiny_model, Path(cached) if cached else models_dir / "tiny-llama")


@pytest.fixture(scope="session")
def tiny32_model_dir(models_dir: Path) -> Path:
    """The tiny model's shape with hidden 128: head dim 32, the least vLLM's CPU attention takes.
    It needs no other model, so one worker builds it while the other builds the hidden-64 one."""
    from tests.helpers import build_tiny_model

    return _built_once(partial(build_tiny_model, hidden_size=128), models_dir / "tiny-llama-hd32")


@pytest.fixture(scope="session")
def digit_model_dir(tiny_model_dir: Path) -> Path:
    """The tiny model after a short supervised warm-up to answer with a random digit."""
    from tests.helpers import pretrain_digits

    return _built_once(partial(pretrain_digits, tiny_model_dir), tiny_model_dir.with_name("tiny-digits"))


@pytest.fixture
def seven_task(tmp_path: Path) -> Path:
    from tests.helpers import write_seven_task

    return write_seven_task(tmp_path / "seven.jsonl")


@pytest.fixture(scope="session")
def digit32_model_dir(tiny32_model_dir: Path) -> Path:
    """The head-dim-32 tiny model after the same digit warm-up (for both engines)."""
    from tests.helpers import pretrain_digits

    return _built_once(
        partial(pretrain_digits, tiny32_model_dir), tiny32_model_dir.with_name("tiny-digits-hd32")
    )
