"""``semrl.train``: the training run of ``semrl train`` as a Python call, for notebooks and scripts."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from semrl.config.load import fresh_run_dir, load_config, validate
from semrl.config.sections import Config

RewardFunction = str | Callable[..., Any]


def _reward_name(function: RewardFunction, in_process: dict[str, Callable[..., Any]]) -> str:
    """The ``reward.functions`` name of a function; callables the reward workers cannot import
    (defined in a notebook or script, or nested) run in this process, under ``__main__:name``."""
    if isinstance(function, str):
        return function
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if module and module != "__main__" and "<" not in qualname:
        try:
            if getattr(importlib.import_module(module), qualname, None) is function:
                return f"{module}:{qualname}"
        except ImportError:
            pass
    name = f"__main__:{getattr(function, '__name__', 'reward')}"
    in_process[name] = function
    return name


def refuse_unguarded_script() -> None:
    """Stop before anything is loaded or written when the script run as ``__main__`` has no
    ``if __name__ == "__main__":`` guard: the reward workers start with ``forkserver`` or ``spawn``,
    which import that script again in each worker, where its top-level ``semrl.train`` would start
    a training of its own (README, the Python example)."""
    from semrl.reward.verify import unguarded_main_script

    script = unguarded_main_script()
    if script is not None:
        raise RuntimeError(
            f"semrl.train was called from {script}, which has no 'if __name__ == \"__main__\":' guard. "
            "semrl's reward workers start with 'forkserver' (or 'spawn'), which import the script again in "
            "each worker, so its top-level code, this training included, would run again in every one of "
            "them. Put the code that trains under the guard:\n\n"
            'if __name__ == "__main__":\n    metrics = semrl.train(...)\n\n'
            "Nothing was loaded or written."
        )


def show_semrl_logs() -> None:
    """Where the program has not configured logging, show semrl's INFO lines on stderr (the run
    directory, a line per step where no progress bar can draw), as ``semrl train`` does."""
    import logging

    ours = logging.getLogger("semrl")
    if not logging.getLogger().handlers and not ours.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)


def train(
    config: str | Path | Config | None = None,
    overrides: Sequence[str] = (),
    reward_functions: Sequence[RewardFunction | tuple[RewardFunction, float]] | None = None,
    resume: bool = False,
) -> dict[str, float]:
    """Train as ``semrl train --config CONFIG OVERRIDES...`` does, in this process; returns the last
    step's metrics (held-out ``eval/...`` included).

    ``reward_functions`` replaces ``reward.functions``: names as in the config, or callables, each
    optionally as ``(function, weight)``. A callable importable from its module runs in the killable
    reward workers like a named one; one defined in a notebook or a script's ``__main__`` runs in
    the training process, without the hard ``reward.timeout_s`` limit (put it in a module to get it).
    """
    refuse_unguarded_script()
    show_semrl_logs()
    from semrl.runtime.trainer import Trainer

    if isinstance(config, Config):
        if overrides:
            raise ValueError(
                "semrl.train: overrides apply to a config file; with a Config object, use dataclasses.replace"
            )
        cfg = config
        if cfg.logging.output_dir == "auto":  # what load_config does for a file
            run_dir = fresh_run_dir(cfg.algorithm.method)
            cfg = dataclasses.replace(cfg, logging=dataclasses.replace(cfg.logging, output_dir=run_dir))
    else:
        cfg = load_config(config, list(overrides))
    in_process: dict[str, Callable[..., Any]] = {}
    if reward_functions is not None:
        pairs = [item if isinstance(item, tuple) else (item, 1.0) for item in reward_functions]
        names = [_reward_name(function, in_process) for function, _ in pairs]
        reward = dataclasses.replace(cfg.reward, functions=names, weights=[float(w) for _, w in pairs])
        cfg = dataclasses.replace(cfg, reward=reward)
        validate(cfg)
    trainer = Trainer(cfg, resume=resume, reward_callables=in_process)
    try:
        result = trainer.train()
    except BaseException:
        trainer.env.processes.close(wait_for_others=False)  # another process may never reach a barrier
        raise
    trainer.env.processes.close()
    return result
