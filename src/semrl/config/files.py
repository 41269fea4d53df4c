"""A run config's raw values: a YAML file (or a packaged config by name) with ``section.key=value``
overrides, and the config written back as YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from semrl.config.sections import Config
from semrl.errors import ConfigError, did_you_mean

# Reading raw values: a YAML file and dotted overrides


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{dotted}': '{part}' is not a section")
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn ``["trainer.lr=2e-6", "rollout.top_k=20"]`` into a nested dict (values read as YAML)."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw != "" else ""
        # YAML reads 2e-6 as a string (no dot); accept it as the float users mean.
        if isinstance(value, str):
            try:
                value = float(value) if any(c in value for c in "eE.") else value
            except ValueError:
                pass
        _set_dotted(tree, key.strip(), value)
    return tree


def merge_values(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` written over it, section by section."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = value
    return out


PACKAGED_CONFIGS = Path(__file__).parents[1] / "configs"


def packaged_configs() -> list[str]:
    """The names of the run configs shipped in the package (``demo``, ``rose_demo``, ...): the
    ``configs/`` YAML files that are not sweeps."""
    return sorted(path.stem for path in PACKAGED_CONFIGS.glob("*.yaml") if not path.stem.startswith("study"))


def config_file(path: str | Path) -> Path:
    """The config file ``path`` names: a file, or else a packaged config by name (``demo`` or
    ``demo.yaml`` is ``semrl/configs/demo.yaml``), so that an installed wheel runs
    ``semrl train --config demo`` without a clone."""
    given = Path(path)
    if given.is_file():
        return given
    named = PACKAGED_CONFIGS / (given.name if given.suffix in (".yaml", ".yml") else f"{given.name}.yaml")
    if len(given.parts) == 1 and named.is_file():
        return named
    if given.exists():
        raise ConfigError(f"config file '{path}' is a directory, not a YAML file; give one such as demo.yaml")
    names = packaged_configs()
    extra = did_you_mean(given.stem, names)
    raise ConfigError(
        f"config file '{path}' does not exist, and no packaged config has that name.{extra} "
        f"Give a YAML file's path, or one of the packaged configs: {', '.join(names)}"
    )


def read_values(path: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The raw nested values of a YAML file (optional) with ``section.key=value`` overrides applied."""
    values: dict[str, Any] = {}
    if path is not None:
        path = config_file(path)
        try:
            values = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            raise ConfigError(f"config file '{path}' is not valid YAML: {err}") from err
        except UnicodeDecodeError:
            raise ConfigError(
                f"config file '{path}' is not text (not UTF-8): give a YAML run config such as "
                "the packaged 'demo'"
            ) from None
        if values is None:  # an empty file (or only comments) would train on bare defaults unnoticed
            raise ConfigError(
                f"config file '{path}' is empty: give at least one section (model:, data:, trainer:, ...), "
                "start from the packaged 'demo' (semrl/configs/demo.yaml), or leave out --config to train "
                "on the defaults that 'semrl config' lists"
            )
        if not isinstance(values, dict):
            kind = "a list" if isinstance(values, list) else f"a {type(values).__name__}"
            hint = ""
            if isinstance(values, list):
                hint = " (a list of decision rules goes to 'semrl compare --decide')"
            raise ConfigError(
                f"config file '{path}' holds {kind}, not a mapping of sections (model:, data:, rollout:, "
                f"...){hint}; see the packaged 'demo' (semrl/configs/demo.yaml)"
            )
        if {"variants", "seeds"} & set(values):
            raise ConfigError(
                f"'{path}' is a sweep file (it has 'variants' / 'seeds'), not a run config: run it with "
                f"'semrl sweep {path}' (docs/sweeps.md), or pass one run's config to --config"
            )
    return merge_values(values, parse_overrides(overrides or []))


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")
