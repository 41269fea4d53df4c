"""``semrl export``: a run's trained model as one Hugging Face model directory.

A full-weight checkpoint already is one (plus the trainer state, which the export leaves out); a
LoRA checkpoint holds only adapters, which are merged into the run's base model
(``W + (alpha / r) B A``, PEFT's ``merge_and_unload``). The directory is written under a temporary
name and renamed into place, so an interrupted export leaves nothing half-written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from semrl.core.atomic import atomic_directory
from semrl.errors import ConfigError
from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
from semrl.models.lora import is_adapter_checkpoint
from semrl.runtime.checkpoint import latest_checkpoint, load_trainer_state, verify_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def load_trained_model(ckpt: Path) -> PreTrainedModel:
    """The trained model of checkpoint ``ckpt`` as a plain transformers model: its own weights, or
    its run's base model (``model.name`` of the config it holds) with its adapters merged, in the
    dtype the trained parameters were held in."""
    model_cfg = load_trainer_state(ckpt)["config"]["model"]
    dtype = "float32" if model_cfg.get("master_weights", True) else model_cfg.get("dtype", "float32")
    if not is_adapter_checkpoint(ckpt):
        return load_model(str(ckpt), dtype)
    from peft import PeftModel

    base = load_model(resolve_model_path(model_cfg["name"], model_cfg.get("cache_dir")), dtype)
    return cast("PreTrainedModel", PeftModel.from_pretrained(base, str(ckpt)).merge_and_unload())


def export_model(run_dir: Path, output: Path | None = None, checkpoint: Path | None = None) -> Path:
    """Write the model of ``checkpoint`` (default: the newest valid one of ``run_dir``) and its
    tokenizer to ``output`` (default ``run_dir/export``), which must not hold anything yet."""
    if checkpoint is None:
        ckpt = latest_checkpoint(run_dir)  # verified against its manifest
        if ckpt is None:
            raise ConfigError(
                f"no valid checkpoint in {run_dir / 'checkpoints'}; train first or pass --checkpoint"
            )
    else:
        ckpt = checkpoint
        problems = verify_checkpoint(ckpt)
        if problems:
            raise ConfigError(f"checkpoint {ckpt} is damaged: {'; '.join(problems)}")
    output = output or run_dir / "export"
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(
            f"{output} already exists and is not empty; pass --output with a new directory or remove it"
        )
    model, tokenizer = load_trained_model(ckpt), load_tokenizer(str(ckpt))
    with atomic_directory(output) as tmp:  # replaces an empty directory only (checked above)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return output
