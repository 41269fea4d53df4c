"""semrl: reinforcement learning with verifiable rewards, built around semantic-entropy-guided
exploration (ROSE, SENT) and their baselines."""

from __future__ import annotations

from typing import Any

from semrl.core.threads import wait_passively

wait_passively()  # before torch loads OpenMP (semrl.core.threads)

__version__ = "0.2.0"

__all__ = ["Config", "ConfigError", "__version__", "load_config", "train"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: loading a config imports every method (and torch); the verifier's
    # worker processes import semrl.reward only and must start fast.
    if name in ("Config", "ConfigError"):
        import semrl.config.sections

        return getattr(semrl.config.sections, name)
    if name == "load_config":
        from semrl.config.load import load_config

        return load_config
    if name == "train":
        from semrl.api import train

        return train
    raise AttributeError(f"module 'semrl' has no attribute '{name}'")
