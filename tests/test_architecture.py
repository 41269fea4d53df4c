"""The layout's promises: no import cycle, plug-ins never see the Trainer, the trainer stays a loop,
and the design notes the code cites ship in docs/."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests.helpers import cli_in_fresh_process

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "src" / "semrl"


@functools.cache
def _nodes_of(source: str) -> tuple[ast.AST, ...]:
    """Every node of ``source``'s tree, in ``ast.walk``'s order, parsed and walked once per text: the
    checks below walk every module of the package, most of them several times (about 5 s a run)."""
    return tuple(ast.walk(ast.parse(source)))


def _nodes(path: Path) -> tuple[ast.AST, ...]:
    return _nodes_of(path.read_text(encoding="utf-8"))


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


# "semrl.methods.rose.method:rose_rollout": a registry entry, imported by name when first used
_REGISTRY_STRING = re.compile(r"(semrl(?:\.\w+)+):\w+(?:\.\w+)*")


def _absolute(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module of ``from <node.module> import ...`` in module ``name``: a relative import
    (``from . import x``, ``from ..y import z``) counts from the module's package."""
    if node.level == 0:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _named_imports(node: ast.AST) -> set[str]:
    """Modules imported by name: ``importlib.import_module("semrl.x")`` (an f-string counts up to
    its first placeholder's package) and registry strings ``"semrl.x.y:function"``."""
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0]
        if called == "import_module":
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                return {first.value}
            if isinstance(first, ast.JoinedStr) and first.values:
                head = first.values[0]
                if isinstance(head, ast.Constant) and isinstance(head.value, str):
                    return {head.value.rsplit(".", 1)[0]}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        match = _REGISTRY_STRING.fullmatch(node.value)
        if match:
            return {match.group(1)}
    return set()


def _imports(name: str, path: Path, modules: dict[str, Path], *, by_name: bool = False) -> set[str]:
    """semrl modules ``name`` imports anywhere: in functions and in type-checking blocks too (a
    type-only import still ties the two modules' designs), relative imports too, plus the packages
    whose ``__init__`` runs on the way. ``by_name``: modules imported by name as well
    (``importlib.import_module``, registry strings), which tie the floors but load only when used."""
    targets: set[str] = set()
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            module = _absolute(name, path, node)
            targets |= {
                f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names
            }
        elif by_name:
            targets |= _named_imports(node)
    deps = set()
    for target in targets:
        parts = target.split(".")
        deps |= {".".join(parts[:k]) for k in range(2, len(parts) + 1)}  # semrl.a, semrl.a.b, ...
    return {d for d in deps if d in modules and d != name and not name.startswith(d + ".")}


def test_no_import_cycle_among_semrl_modules():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    package = tmp_path / "semrl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from semrl.b import g\n")
    (package / "b.py").write_text("from semrl import a\n")
    # a type-only import counts too
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from semrl.a import f\n"
    )
    modules = {
        "semrl": package / "__init__.py",
        "semrl.a": package / "a.py",
        "semrl.b": package / "b.py",
        "semrl.c": package / "c.py",
    }
    assert _imports("semrl.a", modules["semrl.a"], modules) == {"semrl.b"}
    assert _imports("semrl.b", modules["semrl.b"], modules) == {"semrl.a"}
    assert _imports("semrl.c", modules["semrl.c"], modules) == {"semrl.a"}


HEAVY = ("torch", "numpy", "transformers")


def _third_party(path: Path) -> set[str]:
    """Top-level names of every non-semrl module ``path`` imports anywhere (lazy and type-only too)."""
    names = set()
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names - {"semrl"}


def _torch_free_roots(modules: dict[str, Path]) -> list[str]:
    """The config package, the registry and catalog, and every method's package (its options,
    checks and registration)."""
    methods = PACKAGE / "methods"
    return sorted(
        name
        for name, path in modules.items()
        if name.startswith("semrl.config")
        or name in ("semrl.methods", "semrl.methods.registry", "semrl.methods.catalog")
        or (path.name == "__init__.py" and path.parent.parent == methods)
    )


def _heavy_reached(root: str, modules: dict[str, Path]) -> dict[str, set[str]]:
    """The heavy packages each semrl module reachable from ``root`` imports (every import counted)."""
    seen, todo, found = set(), [root], {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if heavy := _third_party(modules[name]) & set(HEAVY):
            found[name] = heavy
        todo += _imports(name, modules[name], modules)
    return found


def test_the_config_and_the_methods_options_import_no_torch():
    """Reading and checking a config needs the config package and every method's options; none of
    them, nor anything they import (in functions and type-checking blocks too), imports torch, numpy
    or transformers. A method's tensor code sits in its folder's other modules, named by string in
    its ``MethodSpec`` and imported when training starts."""
    modules = _modules()
    roots = _torch_free_roots(modules)
    assert {
        "semrl.config.load",
        "semrl.methods.rose",
        "semrl.methods.treepo",
        "semrl.methods.catalog",
    } <= set(roots)
    offenders = {root: found for root in roots if (found := _heavy_reached(root, modules))}
    assert not offenders, f"torch-free modules reach heavy imports: {offenders}"


def test_the_torch_free_check_finds_a_lazy_torch_import(tmp_path):
    package = tmp_path / "semrl"
    (package / "methods" / "toy").mkdir(parents=True)
    (package / "methods" / "toy" / "__init__.py").write_text("from semrl.methods import helper\n")
    (package / "methods" / "helper.py").write_text("def f():\n    import torch.nn\n")
    modules = {
        "semrl.methods.toy": package / "methods" / "toy" / "__init__.py",
        "semrl.methods.helper": package / "methods" / "helper.py",
    }
    assert _heavy_reached("semrl.methods.toy", modules) == {"semrl.methods.helper": {"torch"}}


# The floors, lowest first (docs/architecture.md, "Floors"): a module imports its own floor or lower
# ones only, counting imports in functions and type-checking blocks. The ground floor holds what every
# stage uses and that uses no stage; above it the stages in data-flow order, then what runs them.
FLOORS: list[tuple[str, ...]] = [
    ("semrl", "semrl.errors", "semrl.core"),
    ("semrl.config",),
    ("semrl.data",),
    ("semrl.reward",),
    ("semrl.models",),
    ("semrl.rollout",),
    ("semrl.methods",),
    ("semrl.update",),
    ("semrl.tracking",),
    ("semrl.evaluation",),
    ("semrl.runtime",),
    ("semrl.studies",),
    ("semrl.api", "semrl.cli", "semrl.__main__"),
]
# The imports allowed to go up, each with its reason (at most three).
UPWARD = {
    # method-aware config loading: the loader reads each method's options section, defaults and
    # checks from the registry and the catalog (torch-free, checked above)
    "semrl.config.load": ("semrl.methods",),
    # the package's lazy __getattr__: semrl.Config, semrl.load_config and semrl.train load on first use
    "semrl": ("semrl.config", "semrl.api"),
}


def _floor(name: str) -> int:
    """The floor of module ``name``: that of the longest floor entry it is or sits under."""
    matches = [
        (len(entry), k)
        for k, entries in enumerate(FLOORS)
        for entry in entries
        if name == entry or name.startswith(entry + ".")
    ]
    assert matches, f"{name} is on no floor: add its package to FLOORS"
    return max(matches)[1]


def _upward(modules: dict[str, Path]) -> dict[str, list[str]]:
    """Every import that goes up a floor and is not one of the named exceptions."""
    found: dict[str, list[str]] = {}
    for name, path in modules.items():
        allowed = UPWARD.get(name, ())
        up = sorted(
            dep
            for dep in _imports(name, path, modules, by_name=True)
            if _floor(dep) > _floor(name) and not any(dep == a or dep.startswith(a + ".") for a in allowed)
        )
        if up:
            found[name] = up
    return found


def test_every_import_goes_down_the_floors():
    modules = _modules()
    assert len(UPWARD) <= 3
    assert not _upward(modules), f"imports that go up a floor: {_upward(modules)}"
    # every exception is still needed
    for name, allowed in UPWARD.items():
        assert any(
            _floor(d) > _floor(name) and d.startswith(allowed) for d in _imports(name, modules[name], modules)
        ), name


def test_the_floor_check_finds_an_upward_import(tmp_path):
    modules = _modules()
    rollout = tmp_path / "group_filter.py"
    # a lazy, type-only import from the rollout into the tracking floor, as the collect stage once had
    rollout.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from semrl.tracking.metrics import reward_metrics\n"
    )
    assert _upward({**modules, "semrl.rollout.group_filter": rollout}) == {
        "semrl.rollout.group_filter": ["semrl.tracking", "semrl.tracking.metrics"]
    }
    core = tmp_path / "atomic.py"
    core.write_text("def f():\n    import semrl.runtime.checkpoint\n")
    assert "semrl.core.atomic" in _upward({**modules, "semrl.core.atomic": core})


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        # relative: from the rollout's engines package two levels up into the update floor
        ("semrl.rollout.engines.extra", "from ...update import step\n", "semrl.update"),
        # in a package's __init__, "." is the package itself: "..." is semrl here
        ("semrl.rollout.engines", "from ...update.actor import x\n", "semrl.update.actor"),
        ("semrl.reward.extra", "from ..tracking import metrics\n", "semrl.tracking.metrics"),
        # by name: a constant import_module call, and one built from an f-string
        (
            "semrl.data.extra",
            "import importlib\ndef f():\n    return importlib.import_module('semrl.runtime.trainer')\n",
            "semrl.runtime.trainer",
        ),
        (
            "semrl.data.extra2",
            "from importlib import import_module\ndef f(n):\n    return import_module(f'semrl.update.{n}')\n",
            "semrl.update",
        ),
        # a registry entry's "module:function" string
        (
            "semrl.rollout.extra",
            "ENTRY = 'semrl.methods.rose.method:rose_rollout'\n",
            "semrl.methods.rose.method",
        ),
    ],
)
def test_the_floor_check_finds_each_kind_of_upward_import(tmp_path, module, source, expected):
    modules = _modules()
    path = tmp_path / ("__init__.py" if module == "semrl.rollout.engines" else "extra.py")
    path.write_text(source)
    found = _upward({**modules, module: path})
    assert expected in found.get(module, []), found


def test_stages_import_only_what_they_may():
    """Rules the floors imply, kept by name: a method never imports the update or the runtime, the
    rollout never imports the update, the config's sections know no method, the reward imports no
    training stage (its scoring reads a ``Response`` protocol, not the engine's ``Generation``)."""
    modules = _modules()
    rules = [
        ("semrl.methods", ("semrl.update", "semrl.runtime")),
        # an engine loads a checkpoint as a model directory, knowing none of its other files
        ("semrl.rollout", ("semrl.update", "semrl.runtime", "semrl.core.safe_state")),
        *[
            (f"semrl.config.{name}", ("semrl.methods",))
            for name in (
                "sections",
                "input_sections",
                "sampling_sections",
                "learning_sections",
                "checks",
                "files",
            )
        ],
        ("semrl.reward", ("semrl.update", "semrl.runtime", "semrl.methods", "semrl.rollout")),
    ]
    broken = {
        name: sorted(d for d in _imports(name, path, modules) if d.startswith(forbidden))
        for importer, forbidden in rules
        for name, path in modules.items()
        if name == importer or name.startswith(importer + ".")
    }
    assert not {k: v for k, v in broken.items() if v}, broken


@pytest.mark.e2e  # starts a process
def test_the_config_is_data_importing_no_method_and_no_torch():
    """``semrl.config.sections`` loads without the methods, the engines or torch: a config error, ``--help``
    and the config's own checks do not wait for them (docs/architecture.md)."""
    import subprocess
    import sys

    code = (
        "import sys, semrl.config.sections, semrl.config.checks, semrl.config.files\n"
        "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('semrl.methods', 'semrl.rollout.engines')))\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"semrl.config.sections imports {out.stdout.strip()}"


@pytest.mark.parametrize(
    "argv,code",
    [
        (["--help"], 0),
        (["train", "--help"], 0),
        (["config", "--help"], 0),
        (["config", "--check", "configs/demo.yaml", "trainer.lr=-1"], 2),  # an error in a trainer section
        (["train", "--config", "configs/demo.yaml", "trainer.mini_batch_size=7"], 2),  # across sections
    ],
)
@pytest.mark.e2e  # starts a process
def test_help_and_config_errors_import_no_torch_and_no_method(argv, code):
    """``semrl --help`` and a config error in the trainer's sections answer before torch or a
    method loads (benchmarks/bench_startup.py times them)."""
    exit_code, modules, stderr = cli_in_fresh_process(argv)
    heavy = [m for m in modules if m == "torch" or m.startswith(("semrl.methods", "transformers"))]
    assert (exit_code, heavy) == (code, []), stderr


@pytest.mark.parametrize(
    "argv,code",
    [
        (["config"], 0),
        (["config", "--methods"], 0),
        (["config", "--check", "configs/demo.yaml"], 0),
        (["config", "--check", "configs/demo.yaml", "algorithm.method=rose", "rose.epsilon=2"], 2),
        (
            ["train", "--config", "configs/demo.yaml", "sent.beta_high=-1"],
            2,
        ),  # an error in a method's section
        (["train", "--num-processes", "2", "--config", "configs/demo.yaml", "rose.sd_top_k=0"], 2),
    ],
)
@pytest.mark.e2e  # starts a process
def test_commands_that_read_methods_answer_without_loading_torch(argv, code):
    """The config reference, the methods table, a valid config check and an error in a method's
    section import the methods' option packages but never load torch, numpy or transformers: the
    packages import none of them (``test_the_config_and_the_methods_options_import_no_torch``)."""
    exit_code, modules, stderr = cli_in_fresh_process(argv)
    loaded = [m for m in modules if m.split(".")[0] in ("torch", "numpy", "transformers")]
    assert (exit_code, "semrl.methods.rose" in modules, loaded) == (code, True, []), stderr


def test_no_module_but_the_entry_points_reaches_the_trainer():
    modules = _modules()
    for name, path in modules.items():
        if name in ("semrl.runtime.trainer", "semrl.cli.train", "semrl.api"):  # semrl train, semrl.train
            continue
        assert "semrl.runtime.trainer" not in _imports(name, path, modules), f"{name} imports the trainer"
        args = {
            a.arg
            for node in _nodes(path)
            if isinstance(node, ast.arguments)
            for a in node.args + node.kwonlyargs
        }
        assert "trainer" not in args, f"{name} has a function that takes the trainer"


def test_at_most_three_functions_pass_the_complexity_limits():
    """ruff's C901 / PLR0912 / PLR0915 run at their defaults on src/ (pyproject.toml); a function may
    be excepted in place, with its reason, three at most."""
    excepted = [
        f"{path.name}:{i}"
        for path in PACKAGE.rglob("*.py")
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"noqa:[^#]*\b(C901|PLR0912|PLR0915)\b", line)
    ]
    assert len(excepted) <= 3, excepted
    select = re.search(r"^select = \[(.*)\]", (ROOT / "pyproject.toml").read_text(), re.M)
    assert select and {"C901", "PLR0912", "PLR0915"} <= set(re.findall(r'"(\w+)"', select.group(1)))


def test_methods_reach_no_training_forward_and_the_engine_exposes_no_model():
    """A method's rollout gets the sampling entropy through its context (the trainer owns where it
    is computed); the engine protocol offers sampling, not the model that trains."""
    modules = _modules()
    for name, path in modules.items():
        if name.startswith("semrl.methods."):
            assert "semrl.update.row_logprobs" not in _imports(name, path, modules), (
                f"{name} imports the forward"
            )
    from semrl.rollout.engines.base import Engine

    assert "model" not in Engine.__annotations__


# The engine seam (docs/engines.md): what a method may import from the engines. An engine's own modules
# (hf, vllm, their start-up, KV caches, the row loop) stay behind it; a power is asked for through
# ``Engine.powers``, never by importing the engine that has it.
ENGINE_SEAM = ("semrl.rollout.engines", "semrl.rollout.engines.base")


def _engine_imports(modules: dict[str, Path]) -> dict[str, list[str]]:
    """Every method module's imports of an engine's own module (past the seam)."""
    found: dict[str, list[str]] = {}
    for name, path in modules.items():
        if name.startswith("semrl.methods"):
            inside = sorted(
                dep
                for dep in _imports(name, path, modules)
                if dep.startswith("semrl.rollout.engines.") and dep not in ENGINE_SEAM
            )
            if inside:
                found[name] = inside
    return found


def test_no_method_imports_an_engines_module():
    assert not _engine_imports(_modules())


def test_the_engine_seam_check_finds_an_engine_import(tmp_path):
    modules = _modules()
    method = tmp_path / "method.py"
    method.write_text("def f():\n    from semrl.rollout.engines.hf import RowLoop\n")
    assert _engine_imports({**modules, "semrl.methods.latr.method": method}) == {
        "semrl.methods.latr.method": ["semrl.rollout.engines.hf"]
    }


def test_no_module_is_over_500_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in PACKAGE.rglob("*.py")
        if (n := path.read_text(encoding="utf-8").count("\n")) > 500
    }
    assert not long, f"split these modules: {long}"


def _actor_calls(source: str) -> list[str]:
    """The methods of ``self.actor`` that ``source`` calls."""
    return [
        node.func.attr
        for node in _nodes_of(source)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "actor"
    ]


def test_trainer_is_the_loop():
    source = (PACKAGE / "runtime" / "trainer.py").read_text(encoding="utf-8")
    lines = source.count("\n")
    assert lines < 450, f"trainer.py has {lines} lines; move set-up or helpers to their own modules"
    # the update stage's one front door: the trainer calls the actor once per step
    assert _actor_calls(source) == ["update"]
    assert _actor_calls("order = self.actor.first_order(b)\nself.actor.update(b, a, order)") == [
        "first_order",
        "update",
    ]


def test_every_doc_the_code_cites_ships_in_docs():
    cited = set()
    for path in [*PACKAGE.rglob("*.py"), ROOT / "README.md", *(ROOT / "configs").glob("*.yaml")]:
        text = path.read_text(encoding="utf-8")
        assert "design/" not in text, f"{path} cites a design file outside the repository"
        assert not re.search(r"(?<!docs/)algorithms\.md", text), f"{path} cites algorithms.md without docs/"
        for doc, section in re.findall(r'docs/([\w.-]+\.md)(?:,?\s+"([^"]+)")?', text):
            cited.add((doc, " ".join(section.split())))
    assert cited
    for doc, section in cited:
        page = ROOT / "docs" / doc
        assert page.is_file(), f"docs/{doc} is cited but missing"
        if section:
            headings = [
                h.strip("# ").strip()
                for h in page.read_text(encoding="utf-8").splitlines()
                if h.startswith("#")
            ]
            assert section in headings, f'docs/{doc} has no section "{section}"'


def test_the_trainer_names_no_method_and_methods_see_only_their_config():
    import inspect
    import typing

    from semrl.methods.catalog import METHODS, POLICY_LOSSES
    from semrl.methods.registry import load

    names = set(METHODS) | {"dapo", "grpo", "rose", "sent", "fr3e"}
    tree = _nodes(PACKAGE / "runtime" / "trainer.py")
    words = (
        {n.attr for n in tree if isinstance(n, ast.Attribute)}
        | {n.id for n in tree if isinstance(n, ast.Name)}
        | {n.value for n in tree if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    )
    assert not names & words, f"trainer.py names {sorted(names & words)}"
    for spec in METHODS.values():
        functions = [load(spec.advantage_fn)] + ([load(spec.rollout_fn)] if spec.rollout_fn else [])
        for fn in functions[:1]:
            hints = typing.get_type_hints(fn)
            second = list(inspect.signature(fn).parameters)[1]
            assert "MethodConfig" in str(hints[second]), f"{spec.name}: {fn.__name__} takes {hints[second]}"
        for fn in functions:
            source = inspect.getsource(fn)
            assert "cfg." not in source, f"{spec.name}: {fn.__name__} reads the whole config"
    for loss in POLICY_LOSSES.values():
        loss_fn = load(loss.loss_fn)
        second = list(inspect.signature(loss_fn).parameters)[1]
        assert "MethodConfig" in str(typing.get_type_hints(loss_fn)[second]), loss.name


def test_the_entropy_forward_rule_is_written_once():
    hits = [
        p.name for p in (PACKAGE / "methods").rglob("*.py") if "forward pass for entropies" in p.read_text()
    ]
    assert hits == [], f"the FSDP + vllm entropy rule is written in {hits}; MethodSpec.needs_entropy says it"
    assert (PACKAGE / "config" / "load.py").read_text().count("forward pass for entropies") == 1


def test_package_lines_keep_to_the_configured_length():
    import tomllib

    limit = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["line-length"]
    long = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if len(re.sub(r"\s*# (type: ignore|noqa)\S*$", "", line)) > limit  # ruff lets a pragma overflow
    ]
    assert not long, f"lines over {limit} columns: {long[:10]}"


def test_the_data_layer_imports_no_torch():
    """Problems, prompts, datasets and the curriculum's stages are data: no module of ``semrl.data``,
    nor anything it imports (lazily too), imports torch. Scoring problems by sampling lives in
    ``semrl.evaluation.difficulty``."""
    modules = _modules()
    data = [name for name in modules if name == "semrl.data" or name.startswith("semrl.data.")]
    assert "semrl.data.curriculum" in data
    offenders = {}
    for name in data:
        torch_users = {m for m, heavy in _heavy_reached(name, modules).items() if "torch" in heavy}
        if torch_users:
            offenders[name] = torch_users
    assert not offenders, f"the data layer reaches torch: {offenders}"


def _private_imports(modules: dict[str, Path], package: str = "semrl") -> list[str]:
    """``from <package>.x import _name`` in any of ``modules``: a private name used by another module
    (dunder names such as ``__version__`` are public)."""
    found = []
    for name, path in modules.items():
        for node in _nodes(path):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
                found += [
                    f"{name} imports {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.endswith("__")
                ]
    return found


def test_no_module_imports_another_modules_private_name():
    assert not _private_imports(_modules())


def test_no_test_module_imports_another_test_modules_private_name():
    """What tests share is public in tests/helpers.py (or a fixture), not borrowed from a test file."""
    tests = {str(p.relative_to(ROOT)): p for p in (ROOT / "tests").rglob("*.py")}
    assert not _private_imports(tests, package="tests")


def test_the_private_import_check_finds_one(tmp_path):
    module = tmp_path / "designs.py"
    module.write_text("def f():\n    from semrl.studies.decide import Hypothesis, _hypothesis\n")
    assert _private_imports({"semrl.studies.designs": module}) == [
        "semrl.studies.designs imports semrl.studies.decide._hypothesis"
    ]


def test_a_unit_test_cannot_start_a_process(request):
    """tests/conftest.py marks this test unit (it asks for no model) and so refuses it a process."""
    import multiprocessing
    import subprocess

    assert request.node.get_closest_marker("unit") is not None
    with pytest.raises(AssertionError, match="mark it @pytest.mark.e2e"):
        subprocess.run(["true"], check=False)
    with pytest.raises(AssertionError, match="mark it @pytest.mark.e2e"):
        multiprocessing.get_context("spawn").Process(target=print).start()


def _empty_type_checking_blocks(modules: dict[str, Path]) -> list[str]:
    """``if TYPE_CHECKING: pass``: the leftover of an import that moved."""
    found = []
    for name, path in modules.items():
        for node in _nodes(path):
            if (
                isinstance(node, ast.If)
                and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"
                and all(isinstance(stmt, ast.Pass) for stmt in node.body)
            ):
                found.append(f"{name}:{node.lineno}")
    return found


def test_no_empty_type_checking_block(tmp_path):
    assert not _empty_type_checking_blocks(_modules())
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    pass\n")
    assert _empty_type_checking_blocks({"m": module}) == ["m:3"]


# The fork's state (semrl.rollout.engines.vllm.fork.ForkHooks) and the verbs that change it: an engine
# call marks requests, reports steps, takes handles and ends; only the hooks touch their sets.
FORK_STATE = {"parents", "forks", "held", "deferred", "forked", "fallbacks", "refused"}


def _fork_state_edits(source: str) -> list[str]:
    """Each ``<hooks>.<state>`` in ``source`` (the hooks read from ``forks`` or ``<object>.forks``)."""
    found = []
    for node in _nodes_of(source):
        if isinstance(node, ast.Attribute) and node.attr in FORK_STATE:
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "forks") or (
                isinstance(owner, ast.Attribute) and owner.attr == "forks"
            ):
                found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_the_engine_changes_the_forks_state_only_through_its_verbs():
    package = ROOT / "src" / "semrl" / "rollout" / "engines" / "vllm"
    engine = sorted(path for path in package.glob("*.py") if path.name != "fork.py")
    assert len(engine) >= 5
    assert {path.name: _fork_state_edits(path.read_text()) for path in engine} == {
        path.name: [] for path in engine
    }
    # the check sees such an edit
    assert _fork_state_edits("forks.parents.add(rid)\nself.forks.deferred.clear()\n") == [
        "line 1: .parents",
        "line 2: .deferred",
    ]
