"""Atomic, exact-resume checkpoints in Hugging Face format.

A checkpoint directory ``checkpoints/step-000010`` holds the model (safetensors, loadable with
``AutoModelForCausalLM.from_pretrained``), the tokenizer, and ``trainer_state.pt`` with the
optimizer, scheduler, every RNG state, the data sampler position and the step. It is written to
a temporary sibling directory and renamed into place, so a crash at any moment leaves the last
complete checkpoint intact.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from semrl.errors import ConfigError
from semrl.faults import kill_point

_STEP_DIR = re.compile(r"^step-(\d+)$")


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
    }


def set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["generator"])


def process_rng_state(state: dict[str, Any], ckpt: Path, rank: int, world: int) -> dict[str, Any]:
    """This process's RNG state from a trainer state (one per process when several wrote it)."""
    rng = state["rng"]
    if isinstance(rng, list):
        if len(rng) != world:
            raise ConfigError(
                f"the checkpoint {ckpt} was written by {len(rng)} processes; resume it with "
                f"--num-processes {len(rng)} (this run has {world})"
            )
        return rng[rank]
    if world > 1:
        raise ConfigError(f"the checkpoint {ckpt} was written by 1 process; resume it with 1 process")
    return rng


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives: ``run_dir/checkpoints/step-NNNNNN``."""
    return run_dir / "checkpoints" / f"step-{step:06d}"


def save_checkpoint(
    run_dir: Path, step: int, model: Any, tokenizer: Any, trainer_state: dict[str, Any], keep_last: int,
    model_state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``model`` (or ``model_state``, its full weights, for a sharded model) and the trainer state."""
    final = checkpoint_dir(run_dir, step)
    ckpt_root = final.parent
    ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step-{step:06d}-", dir=ckpt_root))
    tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is meant to be shared
    try:
        if model_state is not None and getattr(model.config, "tie_word_embeddings", False):
            # a gathered state names tied weights twice; the checkpoint stores them once, as HF does
            model_state = {k: v for k, v in model_state.items() if k not in (model._tied_weights_keys or {})}
        model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state)
        tokenizer.save_pretrained(tmp)
        torch.save(trainer_state, tmp / "trainer_state.pt")
        kill_point("checkpoint", step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary directories are ignored)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def cleanup_partial(run_dir: Path) -> None:
    """Remove temporary directories left by a checkpoint write that was interrupted."""
    root = run_dir / "checkpoints"
    if root.is_dir():
        for p in root.glob(".tmp-step-*"):
            shutil.rmtree(p, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    return torch.load(ckpt / "trainer_state.pt", weights_only=False)
