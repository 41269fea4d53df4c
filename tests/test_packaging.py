"""The package a user installs: the wheel, built from this tree and installed into a fresh virtual
environment outside the clone, runs the command line on its own (not this checkout's sources) with
its packaged configs; the sdist builds it again and ships no tests it cannot run; the version, the
CHANGELOG and the long description agree."""

from __future__ import annotations

import email
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the sdist, the wheel built from it), built once as ``python -m build`` does
    and as PyPI receives them: the wheel comes from the sdist, not from the checkout."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "-q", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    (sdist,) = out.glob("semrl-*.tar.gz")
    unpacked_root = tmp_path_factory.mktemp("sdist")
    with tarfile.open(sdist) as tar:
        tar.extractall(unpacked_root, filter="data")
    (unpacked,) = unpacked_root.iterdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(unpacked),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = out.glob("semrl-*.whl")
    return sdist, wheel


@pytest.mark.e2e  # starts a process
def test_the_wheel_installs_into_a_fresh_environment_and_runs(built, tmp_path):
    _, wheel = built
    names = zipfile.ZipFile(wheel).namelist()
    for packaged in (
        "semrl/studies/template.html",
        "semrl/data/benchmarks/math500.jsonl",
        "semrl/studies/stats.py",
        "semrl/py.typed",
        "semrl/configs/demo.yaml",
        "semrl/configs/rose_paper.yaml",
        "semrl/configs/study/study3_rules.yaml",
    ):
        assert packaged in names, packaged
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    env_dir = tmp_path / "fresh"
    # a venv without its own pip (ensurepip: seconds), filled by this environment's pip
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
    )
    # the dependencies (torch, transformers, ...) from this environment's site-packages, read as a
    # plain path: its .pth files, among them this checkout's editable install, are not run
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True}
    where = subprocess.run([str(python), "-c", "import semrl; print(semrl.__file__)"], **run)
    assert where.returncode == 0 and str(env_dir) in where.stdout, where.stdout + where.stderr
    semrl = env_dir / "bin" / "semrl"
    version = subprocess.run([str(semrl), "--version"], **run)
    assert version.returncode == 0 and version.stdout.startswith("semrl "), version.stderr
    helped = subprocess.run([str(semrl), "train", "--help"], **run)
    assert helped.returncode == 0 and "--config" in helped.stdout, helped.stderr
    helped = subprocess.run([str(semrl), "train", "--config", "demo", "--help"], **run)
    assert helped.returncode == 0 and "--config" in helped.stdout, helped.stderr
    assert not (tmp_path / "configs").exists()  # the config below is the wheel's, by name
    checked = subprocess.run([str(semrl), "config", "--check", "demo"], **run)
    assert checked.returncode == 0 and "demo: OK (method dr_grpo)" in checked.stdout, checked.stderr
    for name in ("rose_demo", "treepo_paper", "latr_demo"):
        assert subprocess.run([str(semrl), "config", "--check", name], **run).returncode == 0, name
    # SENT trains on a scored curriculum: the check reads it, and names the command that writes it
    unscored = subprocess.run([str(semrl), "config", "--check", "sent_demo"], **run)
    assert unscored.returncode == 2 and "semrl curriculum score --output" in unscored.stderr, unscored.stderr
    scored = tmp_path / "runs" / "curriculum" / "arithmetic_l1.jsonl"
    scored.parent.mkdir(parents=True)
    scored.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"p{i}",
                    "problem": f"What is {i} + 5?",
                    "answer": str(i + 5),
                    "semantic_entropy": i / 10,
                }
            )
            + "\n"
            for i in range(6)
        )
    )
    checked = subprocess.run([str(semrl), "config", "--check", "sent_demo"], **run)
    assert checked.returncode == 0 and "sent_demo: OK (method sent)" in checked.stdout, checked.stderr
    bad = subprocess.run([str(semrl), "config", "--check", "demo", "trainer.lr=-1"], **run)
    assert bad.returncode == 2 and "config key 'trainer.lr' must be > 0" in bad.stderr


def _release_in_changelog() -> str:
    """The newest released version the CHANGELOG names (its first '## X.Y.Z' heading)."""
    found = re.search(r"^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert found, "CHANGELOG.md has no release heading"
    return found.group(1)


@pytest.mark.e2e  # starts a process
def test_the_sdist_ships_what_builds_the_package_and_no_tests(built):
    """The sdist holds the licence, the package with its configs and data, and no tests (they read the
    clone's docs/ and results/, which it does not ship); a wheel builds from it, with the version the
    CHANGELOG releases and a long description whose links all work off the repository; both pass
    ``twine check --strict`` as PyPI would check them."""
    import semrl

    sdist, wheel = built
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    assert "LICENSE" in names and "src/semrl/configs/demo.yaml" in names and "src/semrl/py.typed" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "results/", "docs/"))]
    twine = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert twine.returncode == 0, twine.stdout + twine.stderr
    metadata_name = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    metadata = email.message_from_bytes(zipfile.ZipFile(wheel).read(metadata_name))
    assert metadata["Version"] == semrl.__version__ == _release_in_changelog()
    citation = re.search(r"^version: (\S+)", (ROOT / "CITATION.cff").read_text(), re.M)
    assert citation and citation.group(1) == semrl.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    description = metadata.get_payload()
    assert "semrl train --config demo" in description
    targets = re.findall(r"\]\(([^)]+)\)", description) + re.findall(r'src="([^"]+)"', description)
    assert not [t for t in targets if not t.startswith(("https://", "http://"))], targets
