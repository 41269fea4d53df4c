"""The documentation: the site builds with no broken link or reference, generated tables are up to
date, and the commands the pages show parse, name files that exist and load their configs; the cheap
ones run."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from semrl.cli import build_parser, main
from semrl.config.load import config_reference, load_config
from semrl.config.load import method_sections as _method_sections
from semrl.config.options import section_reference
from tests.helpers import make_figures_script

ROOT = Path(__file__).resolve().parents[1]
# the methods with a page of their own (the catalog's; tests/test_method_coverage.py requires one of
# every tree method)
PAGED_METHODS = [name for name in _method_sections() if (ROOT / "docs" / "methods" / f"{name}.md").exists()]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _command_lines() -> list[tuple[Path, str]]:
    """Every ``semrl ...`` line inside a fenced code block of the README and the docs (continuations
    joined; what follows ``&&`` or ``#`` dropped)."""
    found = []
    for page in PAGES:
        in_block = False
        pending = ""
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith("```"):
                in_block = not in_block
                continue
            if not in_block:
                continue
            line = pending + line.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            for part in line.split("&&"):
                part = part.split("  #")[0].strip()
                if part.startswith("semrl "):
                    found.append((page, part))
    return found


@pytest.fixture(scope="module")
def strict_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with ``mkdocs build --strict`` for the tests that read it (their xdist
    group keeps them on one worker)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    site = tmp_path_factory.mktemp("strict") / "site"
    mkdocs = shutil.which("mkdocs") or f"{sys.executable} -m mkdocs"
    out = subprocess.run(
        [*shlex.split(mkdocs), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return site


@pytest.mark.e2e  # starts a process
@pytest.mark.xdist_group("site")
def test_the_site_publishes_pages_not_the_builds_inputs(strict_site):
    """The hooks' code, their bytecode and the docs extra's requirements stay out of the site."""
    published = {p.relative_to(strict_site).as_posix() for p in strict_site.rglob("*")}
    assert not [p for p in published if p.startswith("hooks") or "__pycache__" in p or p.endswith(".py")]
    assert "requirements.txt" not in published and "index.html" in published


@pytest.mark.e2e  # starts a process
@pytest.mark.xdist_group("site")
def test_the_site_builds_strictly(strict_site):
    api = (strict_site / "api" / "index.html").read_text()
    assert "compare_seeds" in api and "pass_at_k" in api  # the API reference came from the docstrings
    pages = {p: p.read_text(encoding="utf-8") for p in strict_site.rglob("index.html")}
    assert len(pages) > 15
    for page, text in pages.items():
        # Sphinx roles that the reference would print as they are
        assert not re.search(r":(func|class|meth|mod|attr):`", text), f"{page}: a raw Sphinx role"
        # every code block goes through the highlighter (Pygments' wrapper around it)
        blocks = len(re.findall(r"<pre", text))
        assert blocks == len(re.findall(r'<div class="(language-\w+ )?highlight">\s*<pre', text)), (
            f"{page}: a code block without highlighting"
        )
        # formulas went through the hook into MathML: no TeX left in the page's text
        prose = re.sub(r"<(pre|code|math)\b.*?</\1>", "", text, flags=re.S)
        assert "arithmatex" not in text and not re.search(r"\$[^$<>\s][^$<>]*\\[a-zA-Z]+", prose), (
            f"{page}: an unrendered formula"
        )
        for formula in re.findall(r"<math\b.*?</math>", text, flags=re.S):
            assert "\\" not in formula and "merror" not in formula, f"{page}: TeX MathML could not read"
    algorithms = (strict_site / "algorithms" / "index.html").read_text()
    assert "<title>Algorithms and formulas" in algorithms  # the page title is the navigation title
    # the formulas are rendered math: the ROSE calibration (paper eq. 8) and the GRPO advantage
    assert len(re.findall(r"<math\b", algorithms)) > 40
    assert re.search(r'<math[^>]*display="block".*?<mfrac>.*?<mi>&#x003B1;</mi>', algorithms, flags=re.S)


def test_generated_tables_are_up_to_date():
    assert config_reference() in (ROOT / "docs" / "config-reference.md").read_text()
    assert {"rose", "sent", "treepo", "latr", "fr3e"} <= set(PAGED_METHODS)
    for name in PAGED_METHODS:
        rows = "\n".join(section_reference(name, _method_sections()[name]))
        assert rows in (ROOT / "docs" / "methods" / f"{name}.md").read_text(), (
            f"regenerate docs/methods/{name}.md's options"
        )


def test_readme_is_short_and_the_home_page_follows_it():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    # the site's home page: the README without what only a reader of the repository needs (how to
    # build the site they would be on), its links into docs/ made the site's own
    site = re.sub(r"<!-- readme-only -->.*?<!-- /readme-only -->\n\n?", "", readme, flags=re.S)
    assert "mkdocs serve" in readme and "mkdocs serve" not in site
    assert (ROOT / "docs" / "index.md").read_text() == site.replace("](docs/", "](")


COMMANDS = _command_lines()


def test_ci_runs_the_readmes_test_command_as_written():
    readme = (ROOT / "README.md").read_text()
    (command,) = [line for line in readme.splitlines() if line.endswith("python -m pytest -q")]
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_pages_show_commands():
    assert len(COMMANDS) > 20
    assert {c.split()[1] for _, c in COMMANDS} >= {
        "train",
        "eval",
        "sweep",
        "compare",
        "report",
        "config",
        "curriculum",
    }


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p.name}:{c[:60]}" for p, c in COMMANDS])
def test_every_command_shown_parses_and_its_files_load(page, command, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)[1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as err:
        raise AssertionError(f"{page.name}: '{command}' does not parse") from err
    config = getattr(args, "config", None) or getattr(args, "check", None)
    if config:
        from semrl.config.files import config_file

        config_file(config)  # a file, or a packaged config's name
        load_config(config, getattr(args, "overrides", []))
    if args.command == "sweep":
        from semrl.studies.sweep import load_sweep

        if Path(args.sweep_file).is_file():
            load_sweep(args.sweep_file)
        else:
            assert re.match(r"(study|sweep)\.yaml$", args.sweep_file), (
                f"{page.name}: '{command}' names a missing file"
            )


def test_the_cheap_commands_run(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    for command in (
        "semrl config --check configs/demo.yaml trainer.steps=5",
        "semrl config --methods",
        "semrl sweep configs/study_arith.yaml --dry-run",
    ):
        assert command in {c for _, c in COMMANDS}, command
        assert main(shlex.split(command)[1:]) == 0, command
    out = capsys.readouterr().out
    assert "OK (method dr_grpo)" in out and "| `rose` |" in out and "12 runs (4 variants x 3 seeds)" in out


def _shown(prefix: str) -> list[str]:
    """The commands the pages show that start with ``prefix`` (at least one)."""
    found = sorted({c for _, c in COMMANDS if c.startswith(prefix)})
    assert found, prefix
    return found


# what the pages' commands get added in the tests: a tiny budget (after the model's path)
PAGES_TINY_BUDGET = (
    "rollout.group_size=2",
    "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=4",
    "trainer.steps=1",
    "trainer.micro_batch_size=4",
    "data.eval_size=2",
    "logging.eval_samples=2",
    "reward.num_workers=1",
    "logging.progress=false",
    "logging.report_to=[]",
)


def test_the_pages_commands_run_with_a_tiny_model(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The getting-started path as the pages show it (train, resume, eval, report, export, compare,
    ROSE, a reward function of one's own), each command with a tiny model and a tiny budget added."""
    for name in ("configs", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    tiny = [f"model.name={tiny_model_dir}", *PAGES_TINY_BUDGET]

    made, printed = {}, {}  # the run directories made by name; the pages' examples -> those

    def run(command: str, *extra: str) -> None:
        for example, made in printed.items():
            command = command.replace(example, made)
        assert main([*shlex.split(command)[1:], *extra]) == 0, command

    run("semrl train --config configs/demo.yaml", *tiny)
    run("semrl train --config configs/rose_demo.yaml", *tiny)
    for name in ("demo", "rose_demo"):  # each run made a directory of its own, named as the page says
        (run_dir,) = (tmp_path / "runs").glob(f"{name}-2*")
        made[name] = f"runs/{run_dir.name}"
        (example,) = set(
            re.findall(rf"runs/{name}-\d{{8}}-\d{{6}}", (ROOT / "docs" / "getting-started.md").read_text())
        )
        printed[example] = made[name]
    run(_shown("semrl train --resume runs/demo-")[0], "trainer.steps=2", "logging.progress=false")
    for command in _shown('semrl train --config configs/demo.yaml "reward.functions'):
        run(command, *tiny)
    eval_command = _shown("semrl eval --data arithmetic")[0]
    run(
        eval_command,
        "--model",
        str(tiny_model_dir),
        "--n",
        "2",
        "--limit",
        "2",
        "--max-new-tokens",
        "4",
        "--quiet",
    )
    run(
        f"semrl eval --model {made['demo']}/checkpoints/step-000002 --data arithmetic --n 2 --limit 2 "
        "--max-new-tokens 4 --quiet"
    )
    for command in (*_shown("semrl report"), *_shown("semrl export")):
        run(command)
    run(f"semrl compare {made['demo']} {made['rose_demo']} --output runs/cmp_plots")
    assert (tmp_path / made["rose_demo"] / "report" / "index.html").is_file()
    assert (tmp_path / made["demo"] / "export" / "config.json").is_file()
    assert (tmp_path / "runs" / "eval" / "base" / "results.md").is_file()
    # a run's checkpoint evaluates into a directory named after its run and step
    assert (tmp_path / "runs" / "eval" / f"{Path(made['demo']).name}-step-000002" / "results.md").is_file()


def test_the_readmes_commands_run_in_sequence_on_a_two_column_file(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """The README's demo, then its own-data command as written (a parquet file of 'question' and
    'final' only, the README's my_reward.py), in a fresh directory with tiny sizes added: both train,
    and the own-data run is evaluated on problems of its own file that it never trains on."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    readme = (ROOT / "README.md").read_text()
    reward_code = re.search(r"```python\n(# my_reward\.py.*?)```", readme, re.S).group(1)
    demo = re.search(r"&& (semrl train --config demo)$", readme, re.M).group(1)  # after the install
    (own,) = re.findall(r"^semrl train --config demo data\.train=my_train\.parquet.*$", readme, re.M)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_reward.py").write_text(reward_code)
    pq.write_table(
        pa.table(
            {"question": [f"What is {i} + 2?" for i in range(40)], "final": [str(i + 2) for i in range(40)]}
        ),
        tmp_path / "my_train.parquet",
    )
    tiny = [f"model.name={tiny_model_dir}", *PAGES_TINY_BUDGET]
    for command in (demo, own):
        assert main([*shlex.split(command)[1:], *tiny]) == 0, command
    out = capsys.readouterr().out
    assert "held-out (2 problems of arithmetic)" in out
    assert "held-out (2 problems of my_train.parquet, not trained on)" in out
    # both name the config demo, and each run has a directory of its own (the second in the same
    # second, if it came to that, gets -2)
    assert len(list((tmp_path / "runs").glob("demo-2*/metrics.jsonl"))) == 2


# The README's Python example saved as a script, run as `python example.py` runs it (runpy, as
# __main__, its file the script), after semrl.train is given the tests' tiny sizes.
_RUN_EXAMPLE = """
import os, runpy, sys, time
import semrl, semrl.api
path, sizes = sys.argv[1], sys.argv[2:]
train = semrl.api.train
semrl.api.train = semrl.train = lambda config, overrides=(), **kw: train(config, [*overrides, *sizes], **kw)
os.chdir(os.path.dirname(path))
start = time.monotonic()
try:
    runpy.run_path(path, run_name="__main__")
finally:
    print(f"seconds {time.monotonic() - start:.2f}", file=sys.stderr)
"""


@pytest.mark.e2e  # starts processes
def test_the_readmes_python_example_runs_as_a_saved_script(tiny_model_dir, tmp_path):
    """The example exactly as printed, saved as a script, trains; without its main guard it is refused
    at its first line of semrl, before any run directory or reward worker exists."""
    from tests.forked import run_python

    readme = (ROOT / "README.md").read_text()
    example = re.search(r"```python\n(import semrl\n.*?)```", readme, re.S).group(1)
    sizes = [
        f"model.name={tiny_model_dir}",
        *(o for o in PAGES_TINY_BUDGET if not o.startswith("logging.eval_samples")),
    ]
    guarded = tmp_path / "guarded" / "example.py"
    guarded.parent.mkdir()
    guarded.write_text(example)
    ran = run_python(_RUN_EXAMPLE, str(guarded), *sizes)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert re.search(r"^\d\.\d+$", ran.stdout, re.M)  # the held-out mean@8, printed
    assert len(list((guarded.parent / "runs").glob("demo-2*/metrics.jsonl"))) == 1
    # the same code with its guard taken away: the body of the `if` at the top level
    before, _, after = example.partition('if __name__ == "__main__":')
    body = before + textwrap.dedent(after.split("\n", 1)[1])
    assert "__main__" not in body and "\nmetrics = semrl.train(" in body
    unguarded = tmp_path / "unguarded" / "example.py"
    unguarded.parent.mkdir()
    unguarded.write_text(body)
    refused = run_python(_RUN_EXAMPLE, str(unguarded), *sizes)
    assert refused.returncode == 1
    assert (
        f"semrl.train was called from {unguarded}, which has no 'if __name__ == \"__main__\":'"
        in refused.stderr
    )
    seconds = float(re.search(r"seconds (\S+)", refused.stderr).group(1))
    assert seconds < 5.0, seconds
    assert [p.name for p in unguarded.parent.iterdir()] == ["example.py"]  # no run directory


def test_the_docs_extra_installs_what_the_site_build_imports():
    """`pip install -e ".[docs]" && mkdocs serve` (the README) must not stop on a missing module:
    every third-party module the mkdocs hooks import is in the docs extra."""
    import ast
    import tomllib

    root = Path(__file__).parents[1]
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    listed = {re.split(r"[\[<>=!~ ]", req, maxsplit=1)[0].lower().replace("-", "_") for req in extra}
    hooks = list((root / "docs" / "hooks").glob("*.py"))
    assert hooks
    for hook in hooks:
        for node in ast.walk(ast.parse(hook.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else (
                    [node.module]
                    if isinstance(node, ast.ImportFrom) and node.module and not node.level
                    else []
                )
            )
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("__future__", "mkdocs"):
                    continue
                assert top.lower() in listed, f"{hook.name} imports {top}, missing from the docs extra"


def test_every_figure_in_the_docs_is_drawn_by_the_figures_command():
    """docs/figures holds what `python scripts/make_figures.py` writes, and every page's figure is one
    of them (that each study figure is what `semrl compare` draws from the committed records:
    tests/studies/test_committed_records.py)."""
    make_figures = make_figures_script()
    drawn = {*make_figures.SHOWN, "rose_demo_tree_viewer.png"}
    assert {p.name for p in (ROOT / "docs" / "figures").glob("*.png")} == drawn
    shown = {
        m for page in PAGES for m in re.findall(r"figures/([\w.-]+\.png)", page.read_text(encoding="utf-8"))
    }
    assert shown == drawn


def test_each_method_has_its_own_colour_in_every_docs_figure():
    """Every study figure in docs/ draws each of its study's variants in that method's colour
    (semrl.studies.runs.METHOD_COLORS): a figure that gave a method another colour has none of its pixels."""
    pytest.importorskip("matplotlib")
    import numpy as np
    import yaml
    from matplotlib.colors import to_rgb
    from matplotlib.image import imread

    from semrl.studies.runs import method_color

    make_figures = make_figures_script()
    for name, source in make_figures.SHOWN.items():
        study = source.split("/")[0]
        variants = list(yaml.safe_load((ROOT / "configs" / f"{study}.yaml").read_text())["variants"])
        if name.endswith("_decisions.png"):  # a rule's marks take its variant's colour, not its baseline's
            rules = make_figures.COMPARES[study][0][1]
            body = yaml.safe_load((ROOT / rules).read_text())
            variants = sorted({r["pair"][0] for r in (body["rules"] if isinstance(body, dict) else body)})
        pixels = (imread(ROOT / "docs" / "figures" / name)[..., :3] * 255).round()
        for variant in variants + (["base model"] if "pass_at_k" in name else []):
            colour = np.array(to_rgb(method_color(variant))) * 255
            assert (np.abs(pixels - colour).max(axis=-1) <= 2).sum() >= 200, (name, variant)


@pytest.mark.e2e  # starts a process
def test_the_site_builds_from_the_docs_requirements_alone(tmp_path):
    """`pip install -r docs/requirements.txt && mkdocs serve` (the README): a fresh virtual environment
    with those requirements and nothing else (no semrl, no torch) builds the site strictly; the file
    lists what pyproject's docs extra does."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    requirements = ROOT / "docs" / "requirements.txt"
    listed = [line for line in requirements.read_text().splitlines() if line and not line.startswith("#")]
    assert listed == extra
    assert "pip install -r docs/requirements.txt && mkdocs serve" in (ROOT / "README.md").read_text()
    env_dir = tmp_path / "docs-venv"
    # a venv without its own pip (ensurepip: seconds), filled by this environment's pip
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "-r", str(requirements)],
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode != 0
    built = subprocess.run(
        [str(python), "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(env_dir / "bin")},
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "compare_seeds" in (tmp_path / "site" / "api" / "index.html").read_text()


@pytest.mark.parametrize("method", PAGED_METHODS)
def test_a_method_page_has_a_quick_start_and_names_every_metric_its_code_logs(method):
    """Each method page: a quick start (a command of a packaged config, and the table it prints),
    then what it logs, where every metric key the method's modules write is named."""
    page = (ROOT / "docs" / "methods" / f"{method}.md").read_text()
    headings = re.findall(r"^## (.+)$", page, re.M)
    assert headings[:3] == ["Quick start", "What it logs", "How semrl implements it"], headings
    quick = page.split("## Quick start")[1].split("## What it logs")[0]
    assert re.search(rf"semrl train --config {method}_demo", quick) and "run finished:" in quick
    logs = page.split("## What it logs")[1].split("## How semrl implements it")[0]
    source = "".join(p.read_text() for p in (ROOT / "src" / "semrl" / "methods").rglob("*.py"))
    written = set(re.findall(rf'"({method}/[a-z_]+)"', source))
    if method == "treepo":
        from semrl.methods.treepo.rollout import STOP_REASONS

        written |= {f"treepo/stop_{reason}" for reason in STOP_REASONS}
    if method == "sent":
        written = {f"actor/{k}" for k in re.findall(r'metrics\["(sent_\w+)"\]', source)}
    assert written and not [k for k in sorted(written) if f"`{k}`" not in logs], sorted(written)


def test_the_gpu_is_described_one_way():
    """README, the PyPI description and `semrl --help` say what ran on a GPU (one H200, the hf engine,
    a 2-layer test model for the methods) and what has not (multi-GPU, vLLM on a GPU)."""
    from semrl.cli import build_parser

    texts = {
        "README.md": (ROOT / "README.md").read_text(),
        "README.pypi.md": (ROOT / "README.pypi.md").read_text(),
        "semrl --help": " ".join(build_parser().format_help().split()),
    }
    for where, text in texts.items():
        text = " ".join(text.split())
        assert "H200" in text and "2-layer" in text and "hf engine" in text, where
        assert re.search(
            r"[Mm]ulti-GPU training and vLLM on (a GPU|GPUs|CUDA) (are written|have not)", text
        ), where
        assert "CPU only" not in text and "not yet run on a GPU (README" not in text, where


@pytest.mark.skipif(
    not (shutil.which("chromium") or shutil.which("chromium-browser"))
    and not os.environ.get("SEMRL_REQUIRE_BROWSER"),
    reason="Chromium is not installed (Debian: apt-get install chromium)",
)
@pytest.mark.e2e  # starts a process
@pytest.mark.xdist_group("site")
@pytest.mark.parametrize("width", [1280, 390])
def test_wide_tables_stay_inside_the_content_column(strict_site, width):
    """On the pages with the widest tables, at a laptop's and a phone's width, every table scrolls or
    wraps inside the content column: the page itself never scrolls sideways (headless Chromium)."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e .[dev])"
    )
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "SEMRL_REQUIRE_BROWSER is set but no chromium is on PATH"
    site = strict_site
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": width, "height": 900})
        for name in ("results", "benchmarks", "config-reference", ""):
            page.goto((site / name / "index.html").as_uri())
            tables = page.locator("article table").count()
            assert tables > 0, name
            overflow = page.evaluate("""() => {
                const column = document.querySelector(".md-content").getBoundingClientRect();
                const inside = (el) => {
                    const r = el.getBoundingClientRect();
                    return r.left >= column.left - 1 && r.right <= column.right + 1;
                };
                const out = [];
                for (const table of document.querySelectorAll("article table")) {
                    // fits, or scrolls inside a box (itself or an ancestor) that fits
                    let shown = inside(table);
                    for (let el = table; !shown && el && el.tagName !== "ARTICLE"; el = el.parentElement) {
                        shown = ["auto", "scroll"].includes(getComputedStyle(el).overflowX) && inside(el);
                    }
                    if (!shown) out.push(table.innerText.slice(0, 60));
                }
                return {tables: out, page: document.documentElement.scrollWidth - window.innerWidth};
            }""")
            assert overflow["tables"] == [] and overflow["page"] <= 0, (name or "index", width, overflow)
        browser.close()
