"""Sweeps: one base config, named variants (each a set of overrides) times a list of seeds.

A sweep file (YAML; paths in it are relative to the file)::

    base: ../demo.yaml                  # the config every run starts from
    output_dir: runs/study              # OUT: each run goes to OUT/VARIANT/seed-S
    seeds: [0, 1, 2]
    overrides: {trainer.steps: 20}      # applied to every run (dotted keys or nested sections)
    variants:                           # name -> overrides on top
      dr_grpo: {algorithm.method: dr_grpo}
      rose: {algorithm.method: rose, rose.epsilon: 0.5}
    keep_checkpoints: true              # false: a finished run's checkpoints are deleted
    slurm: {partition: gpu, gpus_per_node: 1, timeout_min: 240, array_parallelism: 8}

Every run's config is built and validated when the file is loaded, so a bad grid (an unknown key,
a variant named twice, a seed that is not an integer) fails before any run starts. A run is *done*
when ``RUN_DIR/sweep_done.json`` exists (written when its ``semrl train`` exits cleanly, with the
wall seconds of every process that ran it, kept as it runs in ``RUN_DIR/sweep_time.json``); a run
directory that holds a run but is not done is resumed from its last valid checkpoint. The
step-0 evaluation of the base model is shared by every run that would sample it identically
(``logging.eval_cache`` = ``OUT/.eval-cache``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml

from semrl.config.load import load_config
from semrl.errors import ConfigError

if TYPE_CHECKING:
    from semrl.config.sections import Config

EVAL_CACHE = ".eval-cache"
TIME_FILE = "sweep_time.json"  # a run's wall seconds so far, over every process that ran it
TIME_EVERY_S = 60.0  # how often a running run's time is written: a killed sweep loses at most this
SWEEP_KEYS = ("base", "output_dir", "seeds", "overrides", "variants", "keep_checkpoints", "slurm")
SLURM_KEYS = (
    "partition",
    "gpus_per_node",
    "cpus_per_task",
    "mem_gb",
    "timeout_min",
    "array_parallelism",
    "account",
)
OWNED_KEYS = ("trainer.seed", "logging.output_dir", "logging.eval_cache")  # the sweep sets these per run
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class SweepError(ConfigError):
    """A sweep file that cannot run; the message names the key and the fix."""


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type information
    """YAML loader that refuses a mapping key given twice (PyYAML keeps the last one silently)."""


def _mapping_without_duplicates(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise SweepError(
                f"the key '{key}' is given twice (line {key_node.start_mark.line + 1}); names must be unique"
            )
        seen.add(key)
    return cast("dict[Any, Any]", loader.construct_mapping(node))


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


@dataclass(frozen=True)
class SweepRun:
    """One run of the grid: a variant at a seed, with the overrides that make its config."""

    variant: str
    seed: int
    run_dir: Path
    overrides: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.variant}/seed-{self.seed}"


@dataclass(frozen=True)
class Sweep:
    """A sweep file read and checked: the base config, seeds, variants (their overrides) and where the
    runs go; ``runs`` lists every (variant, seed) run in order."""

    path: Path
    base: Path | None
    output_dir: Path
    seeds: tuple[int, ...]
    variants: dict[str, tuple[str, ...]]
    keep_checkpoints: bool
    slurm: dict[str, Any]
    runs: tuple[SweepRun, ...] = field(default=())

    def variant_config(self, variant: str, overrides: Sequence[str] = ()) -> Config:
        """``variant``'s config (the base, the sweep's common overrides, the variant's own), then
        ``overrides``; a run of the sweep adds its seed and directories (``SweepRun.overrides``)."""
        if variant not in self.variants:
            raise SweepError(
                f"{self.path} has no variant '{variant}'; its variants: {', '.join(self.variants)}"
            )
        return load_config(self.base, [*self.variants[variant], *overrides])


def _flatten(values: Any, where: str, prefix: str = "") -> dict[str, Any]:
    """``{trainer: {steps: 2}, "rollout.top_k": 5}`` -> ``{"trainer.steps": 2, "rollout.top_k": 5}``."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise SweepError(f"sweep key '{where}' must be a mapping of config keys to values, got {values!r}")
    out: dict[str, Any] = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, where, dotted + "."))
        else:
            out[dotted] = value
    return out


def _override(key: str, value: Any) -> str:
    # JSON is YAML: the value reads back with its type (lists, null, strings that look like numbers)
    return f"{key}={json.dumps(value)}"


def _read_sweep_file(path: Path) -> dict[str, Any]:
    """The sweep file's mapping, its keys checked against ``SWEEP_KEYS``."""
    if not path.is_file():
        raise SweepError(f"sweep file '{path}' does not exist")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except SweepError as err:
        raise SweepError(f"sweep file '{path}': {err}") from None
    except yaml.YAMLError as err:
        raise SweepError(f"sweep file '{path}' is not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise SweepError(f"sweep file '{path}' must be a mapping with keys {', '.join(SWEEP_KEYS)}")
    for key in raw:
        if key not in SWEEP_KEYS:
            raise SweepError(
                f"sweep file '{path}': unknown key '{key}'; the keys are {', '.join(SWEEP_KEYS)}"
            )
    if "output_dir" not in raw or not isinstance(raw["output_dir"], str):
        raise SweepError("sweep key 'output_dir' is missing: the directory that receives OUT/VARIANT/seed-S")
    return raw


def _seeds(raw: dict[str, Any]) -> list[int]:
    seeds = raw.get("seeds", [0])
    integers = isinstance(seeds, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    if not integers or not seeds:
        raise SweepError(f"sweep key 'seeds' must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"sweep key 'seeds' lists a seed twice: {seeds}")
    return cast("list[int]", seeds)


def _settings(raw: dict[str, Any], path: Path) -> tuple[Path | None, dict[str, Any], bool]:
    """(base config, slurm options, keep_checkpoints) of the sweep file at ``path``."""
    base = (path.parent / raw["base"]).resolve() if raw.get("base") else None
    if base is not None and not base.is_file():
        raise SweepError(
            f"sweep key 'base': config file '{base}' does not exist (paths are relative to the sweep file)"
        )
    slurm = raw.get("slurm") or {}
    if not isinstance(slurm, dict) or any(k not in SLURM_KEYS for k in slurm):
        raise SweepError(f"sweep key 'slurm' takes {', '.join(SLURM_KEYS)}; got {slurm!r}")
    keep = raw.get("keep_checkpoints", True)
    if not isinstance(keep, bool):
        raise SweepError(f"sweep key 'keep_checkpoints' must be true or false, got {keep!r}")
    return base, slurm, keep


def _variant_overrides(name: Any, values: Any, common: dict[str, Any]) -> tuple[str, ...]:
    """The overrides of variant ``name``: the sweep's common ones, then its own."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise SweepError(f"variant name {name!r}: use letters, digits and _ . + - (it names a directory)")
    own = _flatten(values, f"variants.{name}")
    for key in (*common, *own):
        if key in OWNED_KEYS:
            raise SweepError(f"variant '{name}': '{key}' is set by the sweep for each run; remove it")
    return tuple(_override(k, v) for k, v in {**common, **own}.items())


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep file; every run's config is built, so errors surface here."""
    path = Path(path)
    raw = _read_sweep_file(path)
    seeds = _seeds(raw)
    base, slurm, keep = _settings(raw, path)
    variants = raw.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise SweepError("sweep key 'variants' must map at least one variant name to its overrides")
    common = _flatten(raw.get("overrides"), "overrides")
    out = Path(raw["output_dir"])
    runs, by_variant = [], {}
    for name, values in variants.items():
        by_variant[name] = overrides = _variant_overrides(name, values, common)
        for seed in seeds:
            run_dir = out / name / f"seed-{seed}"
            run = SweepRun(
                name,
                seed,
                run_dir,
                (
                    *overrides,
                    _override("trainer.seed", seed),
                    _override("logging.output_dir", str(run_dir)),
                    _override("logging.eval_cache", str(out / EVAL_CACHE)),
                ),
            )
            try:
                load_config(base, list(run.overrides))
            except ConfigError as err:
                raise SweepError(f"variant '{name}' (seed {seed}): {err}") from None
            runs.append(run)
    order = sorted(runs, key=lambda r: (seeds.index(r.seed), list(variants).index(r.variant)))  # seed by seed
    return Sweep(path, base, out, tuple(seeds), by_variant, keep, slurm, tuple(order))
