"""Start-up: how long the commands that load no model take to answer, each in a fresh process,
beside ``python -c "import torch"`` (the floor of any command that imports a method).

    python benchmarks/bench_startup.py [--repeats 5]

The median wall time of each command over ``--repeats`` runs (page cache warm: one untimed run
first). The parser, the config package and every method's package (its options, checks and
registration) import no torch, numpy or transformers (tests/test_architecture.py counts every
import), so ``--help``, the reference, the methods table and every config error answer without
loading them, from the CLI and from the Python API alike.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEMRL = [sys.executable, "-m", "semrl"]

COMMANDS: dict[str, list[str]] = {
    "python (no import)": [sys.executable, "-c", "pass"],
    "import torch": [sys.executable, "-c", "import torch"],
    "semrl --help": [*SEMRL, "--help"],
    "semrl train --help": [*SEMRL, "train", "--help"],
    "config error (trainer.lr=-1), semrl train": [
        *SEMRL,
        "train",
        "--config",
        "configs/demo.yaml",
        "trainer.lr=-1",
    ],
    "config error (trainer.lr=-1), semrl config --check": [
        *SEMRL,
        "config",
        "--check",
        "configs/demo.yaml",
        "trainer.lr=-1",
    ],
    "config error (rose.epsilon=2), a method's section": [
        *SEMRL,
        "config",
        "--check",
        "configs/demo.yaml",
        "algorithm.method=rose",
        "rose.epsilon=2",
    ],
    "semrl config --check configs/demo.yaml (valid)": [*SEMRL, "config", "--check", "configs/demo.yaml"],
    "config error (sent.beta_high=-1), semrl train": [
        *SEMRL,
        "train",
        "--config",
        "configs/demo.yaml",
        "sent.beta_high=-1",
    ],
    "semrl config --methods": [*SEMRL, "config", "--methods"],
    "semrl config (the reference)": [*SEMRL, "config"],
    "Python API: semrl.load_config('configs/rose_demo.yaml')": [
        sys.executable,
        "-c",
        "import semrl; semrl.load_config('configs/demo.yaml', ['algorithm.method=rose'])",
    ],
}


def _seconds(command: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(command, cwd=cwd, capture_output=True, check=False)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| command | median (s) | min (s) | vs import torch |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:  # nothing a command writes lands in the repository
        cwd = Path(scratch)
        (cwd / "configs").mkdir()
        (cwd / "configs" / "demo.yaml").write_text((REPO / "configs" / "demo.yaml").read_text())
        times = {}
        for name, command in COMMANDS.items():
            _seconds(command, cwd)
            times[name] = [_seconds(command, cwd) for _ in range(args.repeats)]
        torch_s = statistics.median(times["import torch"])
        for name, values in times.items():
            median = statistics.median(values)
            print(f"| {name} | {median:.2f} | {min(values):.2f} | {median / torch_s:.2f}x |")


if __name__ == "__main__":
    main()
