"""Atomic, exact-resume checkpoints in Hugging Face format.

A checkpoint directory ``checkpoints/step-000010`` holds the model (safetensors, loadable with
``AutoModelForCausalLM.from_pretrained``, ``vllm serve`` or SGLang as it is), the tokenizer, in the
subfolder ``trainer_state/`` the trainer state (optimizer, scheduler, every RNG state, the data
sampler position, the step; ``semrl.core.safe_state``: JSON + safetensors, no pickle; kept out of the
weight files' way, since inference engines load every ``*.safetensors`` beside the config) and,
written last, ``manifest.json``: every file's size and SHA-256, the step and the semrl version.
It is written to a temporary sibling directory and renamed into place, so a crash at any moment
leaves the last complete checkpoint intact; ``verify_checkpoint`` finds one damaged later
(a truncated copy, a full disk, bit rot), and ``--resume`` falls back to the newest valid one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import random
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from semrl import __version__
from semrl.core.atomic import atomic_directory
from semrl.core.faults import NO_FAULTS, Faults
from semrl.core.safe_state import STATE_JSON, load_state, save_state
from semrl.errors import ConfigError, TrainingError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")
MANIFEST = "manifest.json"
LEGACY_STATE = "trainer_state.pt"  # semrl 0.1's pickled trainer state: named in an error, never loaded
STATE_DIR = "trainer_state"  # the trainer state's subfolder


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path, step: int) -> None:
    """``manifest.json``: size and SHA-256 of every file of ``directory``; written last."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {str(p.relative_to(directory)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    manifest = {"format": 1, "semrl_version": __version__, "step": step, "files": entries}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def verify_checkpoint(ckpt: Path) -> list[str]:
    """What is wrong with ``ckpt`` (empty: it is complete and every file matches its manifest)."""
    if (ckpt / LEGACY_STATE).exists() and not (ckpt / MANIFEST).exists():
        return [
            f"written by semrl 0.1 ({LEGACY_STATE}, a pickle, which semrl never loads because it can run "
            "code); resume it with semrl 0.1.0, or start the run again"
        ]
    try:
        manifest = json.loads((ckpt / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
    except FileNotFoundError:
        return [f"{MANIFEST} is missing (the checkpoint was not completely written or copied)"]
    except (ValueError, KeyError, TypeError) as err:
        return [f"{MANIFEST} is unreadable ({err})"]
    problems = []
    for name, entry in files.items():
        path = ckpt / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif path.stat().st_size != entry["size"]:
            problems.append(f"{name} has {path.stat().st_size} bytes, the manifest says {entry['size']}")
        elif _sha256(path) != entry["sha256"]:
            problems.append(f"{name} does not match its checksum (the file was changed or damaged)")
    return problems


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
        return cast("dict[str, Any]", rng[rank])
    if world > 1:
        raise ConfigError(f"the checkpoint {ckpt} was written by 1 process; resume it with 1 process")
    return cast("dict[str, Any]", rng)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives: ``run_dir/checkpoints/step-NNNNNN``."""
    return run_dir / "checkpoints" / f"step-{step:06d}"


@contextmanager
def _no_transformers_bars() -> Iterator[None]:
    """transformers' progress bars off for the block, as they were after it."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    trainer_state: dict[str, Any],
    keep_last: int,
    model_state: dict[str, torch.Tensor] | None = None,
    faults: Faults = NO_FAULTS,
) -> Path:
    """Write ``model`` (or ``model_state``, its full weights, for a sharded model) and the trainer state."""
    final = checkpoint_dir(run_dir, step)
    written = 0
    try:
        with atomic_directory(final, prefix=f".tmp-step-{step:06d}-") as tmp:
            try:
                if model_state is not None and getattr(model.config, "tie_word_embeddings", False):
                    # a gathered state names tied weights twice; the checkpoint stores them once, as HF does
                    tied = model._tied_weights_keys or {}
                    model_state = {k: v for k, v in model_state.items() if k not in tied}
                with _no_transformers_bars():  # its "Writing model shards" bar, at every checkpoint
                    model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state)
                tokenizer.save_pretrained(tmp)
                (tmp / STATE_DIR).mkdir()
                save_state(trainer_state, tmp / STATE_DIR)
                write_manifest(tmp, step)
                faults.at("checkpoint", step)
            except OSError:
                written = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())
                raise
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        previous = list_checkpoints(run_dir)
        needed = max(
            written, sum(f.stat().st_size for f in previous[-1].rglob("*") if f.is_file()) if previous else 0
        )
        free = shutil.disk_usage(final.parent).free
        kept = "no earlier checkpoint exists"
        if previous:
            kept = f"the previous checkpoint {previous[-1]} is intact"
        raise TrainingError(
            "no space left on the device while writing the "
            f"checkpoint of step {step} in {final.parent}: it needs "
            f"about {needed / 2**30:.2f} GiB and {free / 2**30:.2f} "
            f"GiB are free; {kept}. Free some space (or lower "
            f"logging.keep_last), then continue with 'semrl train --resume {run_dir}'"
        ) from err
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


def resumable_checkpoint(run_dir: Path) -> tuple[Path | None, list[tuple[Path, list[str]]]]:
    """(the newest checkpoint that verifies or None, each newer one that does not with its problems,
    newest first); each skipped one is named in a warning."""
    skipped: list[tuple[Path, list[str]]] = []
    for ckpt in reversed(list_checkpoints(run_dir)):
        problems = verify_checkpoint(ckpt)
        if not problems:
            return ckpt, skipped
        logger.warning("skipping checkpoint %s: %s", ckpt, "; ".join(problems))
        skipped.append((ckpt, problems))
    return None, skipped


def kept_checkpoint(run_dir: Path) -> str:
    """What a run that stops now keeps, in words: its last checkpoint and the command that continues."""
    last = latest_checkpoint(run_dir)
    if last is None:
        return "No checkpoint was written yet. "
    return f"Its last checkpoint, {last}, is kept: 'semrl train --resume {run_dir}' continues from it. "


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that verifies; each newer one that does not is named in a warning."""
    return resumable_checkpoint(run_dir)[0]


def trainer_state_dir(ckpt: Path) -> Path:
    """Where a checkpoint keeps its trainer state."""
    return ckpt / STATE_DIR


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint, loaded without running any code."""
    if not (trainer_state_dir(ckpt) / STATE_JSON).exists():
        raise ConfigError(f"checkpoint {ckpt}: " + "; ".join(verify_checkpoint(ckpt) or ["no trainer state"]))
    return load_state(trainer_state_dir(ckpt))
