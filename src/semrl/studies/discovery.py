"""Finding a study's runs: a sweep directory (``OUT/VARIANT/seed-S``) or run directories grouped by
a config key, each read as a ``Run`` (its variant, seed, directory and logged metric rows)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from semrl.core.jsonl import log_exists, read_jsonl
from semrl.studies.decide import (
    NO_SIGNAL,
)
from semrl.tracking import metric_names as names

logger = logging.getLogger(__name__)

# what a sweep writes in a run's directory when its semrl train exits cleanly (semrl.studies.sweep_runs)
DONE_FILE = "sweep_done.json"
TOKENS = names.SAMPLED_TOKENS  # logged every step: the compute axis
SEED_DIR = re.compile(r"^seed-(\d+)$")
SPLITS = ("eval", "transfer")
CURVE_METRICS = [
    names.REWARD,
    names.ACCURACY,
    names.ENTROPY,
    names.LOW_ENTROPY_FRAC,
    names.KL,
    names.RESPONSE_LENGTH,
    names.CORRECT_LENGTH,
    names.DISTINCT_ANSWERS,
    names.STEP_S,
]


@dataclass(frozen=True)
class Run:
    """One finished run of a study: its variant, seed, directory and logged metric rows."""

    variant: str
    seed: int
    run_dir: Path
    rows: list[dict[str, Any]]

    def series(self, metric: str) -> dict[int, float]:
        """step -> the last value logged for that step."""
        out: dict[int, float] = {}
        for row in self.rows:
            value = row.get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                out[int(row["step"])] = float(value)
        return out

    def final(self, metric: str, window: int = 1) -> float | None:
        """The last value logged, or with ``window`` the mean over the last that many logged steps."""
        points = self.series(metric)
        if not points:
            return None
        last = sorted(points)[-window:]
        return float(np.mean([points[s] for s in last]))

    def curve(self, metric: str) -> float | None:
        """The mean over every value logged after step 0: a learning curve's area per evaluation."""
        points = [value for step, value in self.series(metric).items() if step > 0]
        return float(np.mean(points)) if points else None

    def collapsed(self) -> float | None:
        """1.0 when the run had no reward signal (every group's rewards equal) in more than half of
        its steps, else 0.0; None when it logged no ``reward/frac_groups_all_equal``
        (``semrl.studies.decide``, the ``collapsed`` metric)."""
        shares = self.series(NO_SIGNAL)
        if not shares:
            return None
        silent = sum(1 for step, share in shares.items() if step > 0 and share >= 1.0)
        steps = sum(1 for step in shares if step > 0)
        return float(silent > steps / 2)

    def eval_steps(self, split: str) -> list[int]:
        return sorted(self.series(f"{split}/problems"))


def _config_value(run_dir: Path, dotted: str) -> Any:
    config = (
        yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").exists() else {}
    )
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"{run_dir / 'config.yaml'} has no key '{dotted}' to group by")
        node = node[part]
    return node


def _sweep_runs(root: Path) -> list[tuple[str, int, Path]]:
    """(variant, seed, run directory) of a sweep directory's ``VARIANT/seed-S`` runs; while the
    sweep still runs, only the finished ones (a half-run would bias the means)."""
    if not root.exists():
        raise FileNotFoundError(
            f"'{root}' does not exist: give a sweep directory (the output_dir of a sweep file)"
        )
    children = sorted(root.iterdir()) if root.is_dir() else []
    variant_dirs = [p for p in children if p.is_dir() and not p.name.startswith(".")]
    found = [
        (variant_dir.name, int(match.group(1)), run_dir)
        for variant_dir in variant_dirs
        for run_dir in sorted(variant_dir.iterdir())
        if (match := SEED_DIR.match(run_dir.name)) and log_exists(run_dir / "metrics.jsonl")
    ]
    if any((run_dir / DONE_FILE).exists() for _, _, run_dir in found):
        unfinished = [r for r in found if not (r[2] / DONE_FILE).exists()]
        if unfinished:
            logger.warning(
                "%d unfinished run(s) left out: %s",
                len(unfinished),
                ", ".join(f"{v}/seed-{s}" for v, s, _ in unfinished),
            )
        found = [r for r in found if (r[2] / DONE_FILE).exists()]
    if not found:
        raise FileNotFoundError(
            f"{root} holds no VARIANT/seed-S run with a metrics.jsonl: is it a sweep directory?"
        )
    return found


def _grouped_runs(paths: Sequence[str | Path], group_by: str) -> list[tuple[str, int, Path]]:
    """(variant, seed, run directory) of run directories, the variant read from the config key
    ``group_by`` and the seed from ``trainer.seed``."""
    found = []
    for path in map(Path, paths):
        if not log_exists(path / "metrics.jsonl"):
            raise FileNotFoundError(
                f"{path / 'metrics.jsonl'} does not exist: is '{path}' a semrl run directory?"
            )
        found.append((str(_config_value(path, group_by)), int(_config_value(path, "trainer.seed")), path))
    return found


def run_directories(paths: Sequence[str | Path], group_by: str | None = None) -> dict[str, Path]:
    """``VARIANT/seed-S`` -> run directory of the runs ``find_runs`` groups, without reading their
    metrics."""
    found = _sweep_runs(Path(paths[0])) if group_by is None else _grouped_runs(paths, group_by)
    return {f"{variant}/seed-{seed}": run_dir for variant, seed, run_dir in found}


def find_runs(
    paths: Sequence[str | Path], group_by: str | None = None, seeds: Sequence[int] | None = None
) -> dict[str, list[Run]]:
    """Runs grouped into variants: one sweep directory (its ``VARIANT/seed-S`` runs), or run
    directories grouped by the config key ``group_by`` (seed: ``trainer.seed``). ``seeds``: keep
    only these seeds, e.g. those whose runs have all finished while a sweep goes on."""
    if group_by is None and len(paths) != 1:
        raise ValueError(
            "give one sweep directory, or run directories with --group-by KEY (e.g. algorithm.method)"
        )
    found = _sweep_runs(Path(paths[0])) if group_by is None else _grouped_runs(paths, group_by)
    if seeds is not None:
        wanted, have = set(seeds), {seed for _, seed, _ in found}
        if missing := sorted(wanted - have):
            raise ValueError(
                f"--seeds: no finished run has seed {', '.join(map(str, missing))}; the runs' seeds "
                f"are {sorted(have)}"
            )
        found = [r for r in found if r[1] in wanted]
    groups: dict[str, list[Run]] = {}
    for variant, seed, run_dir in found:
        if any(r.seed == seed for r in groups.get(variant, [])):
            raise ValueError(
                f"variant '{variant}' has two runs with seed {seed} ({run_dir}); group by another key"
            )
        groups.setdefault(variant, []).append(
            Run(variant, seed, run_dir, read_jsonl(run_dir / "metrics.jsonl"))
        )
    return {v: sorted(runs, key=lambda r: r.seed) for v, runs in groups.items()}
