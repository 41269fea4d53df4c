"""Errors that stop a run with a message saying what to do (data errors live beside their parser:
``semrl.data.DataError``)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path


def closest(given: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The entry of ``known`` closest to ``given`` (difflib's ratio at least ``cutoff``), or None."""
    close = difflib.get_close_matches(given, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(given: str, known: Iterable[str], cutoff: float = 0.6, prefix: str = "") -> str:
    """`` Did you mean 'PREFIX+MATCH'?`` for the closest entry of ``known``, or "" when none is close:
    the hint every unknown name in a config, a command line or a registry ends with."""
    match = closest(given, known, cutoff)
    return f" Did you mean '{prefix}{match}'?" if match is not None else ""


class ConfigError(ValueError):
    """A configuration problem that names the key and says how to fix it."""


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many non-finite updates); the message says what to do."""

    @classmethod
    def bad_updates(cls, count: int, limit: int, step: int, checkpoint: Path, run_dir: Path) -> TrainingError:
        return cls(
            f"{count} optimizer updates in a row had a NaN/inf loss or gradient norm and were skipped "
            f"(trainer.max_bad_updates={limit}), the last at step {step}. The weights are those of the last "
            f"good update, saved in {checkpoint}. Look for the cause (learning rate, model.dtype=float16 "
            f"overflow, rewards), then continue with 'semrl train --resume {run_dir}' and any overrides, "
            "or set trainer.max_bad_updates=0 to keep skipping."
        )


class EngineError(ValueError):
    """The sampling engine cannot start with these settings (vLLM missing, a model it cannot
    load, a KV cache too small); the message names the setting to change."""


class Preempted(TrainingError):
    """The run stopped on a signal after a complete step, with a checkpoint (``semrl.runtime.preemption``)."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path, run_dir: Path) -> None:
        done = f"after step {step}" if step else "after the base evaluation, before step 1,"
        super().__init__(
            f"{signal_name} received: stopped {done} "
            f"with its checkpoint {checkpoint}; continue with "
            f"'semrl train --resume {run_dir}'"
        )


class Interrupted(Exception):
    """Ctrl-C before the run's signal handler was installed (while loading): nothing was trained or
    saved. The message says what was done and how to start again."""

    @classmethod
    def while_loading(cls, run_dir: Path, resume: bool, removed: bool = False) -> Interrupted:
        if resume:
            return cls(
                f"interrupted while loading, before training resumed: {run_dir} is as it was; "
                f"continue it with 'semrl train --resume {run_dir}'"
            )
        saved = f"and the new run directory {run_dir} is removed" if removed else f"or saved in {run_dir}"
        return cls(
            f"interrupted while loading, before step 1: nothing was trained {saved}; the same command "
            "starts the run again"
        )
