"""The wheel a user installs: built from this tree, installed into a fresh virtual environment, it
runs the command line on its own (not this checkout's sources)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_into_a_fresh_environment_and_runs(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    (wheel,) = dist.glob("semrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for packaged in ("semrl/report/template.html", "semrl/data/benchmarks/math500.jsonl", "semrl/report/stats.py"):
        assert packaged in names, packaged
    env_dir = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True)
    # the dependencies (torch, transformers, ...) from this environment's site-packages, read as a
    # plain path: its .pth files, among them this checkout's editable install, are not run
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
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
    checked = subprocess.run([str(semrl), "config", "--check", str(ROOT / "configs" / "demo.yaml")], **run)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    bad = subprocess.run([str(semrl), "config", "--check", str(ROOT / "configs" / "demo.yaml"), "trainer.lr=-1"], **run)
    assert bad.returncode == 2 and "config key 'trainer.lr' must be > 0" in bad.stderr
