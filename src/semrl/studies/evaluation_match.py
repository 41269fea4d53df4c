"""Whether runs were evaluated alike, so that their held-out numbers can be set side by side: the
same held-out problems, reward functions and evaluation settings, read from each run's config."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from semrl.config.held_out_settings import (
    HELD_OUT_FROM_TRAIN,
    HOW_SAMPLED_AND_JUDGED,
    WHICH_PROBLEMS,
    decides_held_out,
    setting,
)

# (section, key): what decides a run's held-out problems, how they are asked and how they are scored;
# the same settings as the held-out cache key's (semrl.config.held_out_settings)
EVALUATION_KEYS = WHICH_PROBLEMS + tuple((section, key) for _, section, key in HOW_SAMPLED_AND_JUDGED)


def evaluation_differences(run_dirs: Sequence[str | Path]) -> dict[str, dict[str, Any]]:
    """``section.key`` -> {run directory: its value}, for every evaluation setting on which the runs
    differ. A run whose config.yaml is missing is not compared, and is in no value's runs. A setting
    that does not decide a run's held-out samples (``rollout.temperature`` where
    ``logging.eval_temperature`` is set) has the value None there."""
    import yaml

    configs = {}
    for run_dir in run_dirs:
        path = Path(run_dir) / "config.yaml"
        if path.is_file():
            configs[str(run_dir)] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    keys = list(EVALUATION_KEYS)
    if any(setting(c, "data", "eval") == "auto" for c in configs.values()):
        keys += HELD_OUT_FROM_TRAIN
    differ = {}
    for section, key in keys:
        values = {
            run: setting(c, section, key) if decides_held_out(c, section, key) else None
            for run, c in configs.items()
        }
        if len({repr(v) for v in values.values()}) > 1:
            differ[f"{section}.{key}"] = values
    return differ


def sampling_dtype(config: dict[str, Any]) -> str:
    """The dtype a run's config says its engine sampled in, with the engine: ``rollout.vllm_dtype``
    where set, else ``model.dtype`` (as resolved when the run started; ``auto`` only in a config
    that never started)."""
    model, rollout = config.get("model", {}), config.get("rollout", {})
    engine = rollout.get("engine", "hf")
    dtype = (rollout.get("vllm_dtype") if engine == "vllm" else None) or model.get("dtype", "float32")
    return f"{dtype} ({engine})"


def dtype_note(runs: dict[str, Path]) -> str | None:
    """A line saying the runs (name -> run directory) sampled in different dtypes (their samples
    differ as a sampler and a trainer in different dtypes do, docs/training.md "Precision"), or None
    when they all agree. A run without config.yaml is not compared."""
    import yaml

    dtypes = {
        name: sampling_dtype(yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {})
        for name, run_dir in runs.items()
        if (run_dir / "config.yaml").is_file()
    }
    if len(set(dtypes.values())) <= 1:
        return None
    listed = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
    return (
        f"**Sampled in different dtypes**: {listed}. Their rollouts and held-out samples come from "
        "different numerics; a difference between them includes the dtype's."
    )
