"""LoRA: trained low-rank adapters on a frozen base model (docs/training.md "LoRA").

The adapters live inside the Hugging Face model (PEFT through transformers' ``add_adapter``), so
the trained model stays a ``PreTrainedModel`` and every forward (padded, tree-packed, sampling)
runs unchanged. What LoRA changes elsewhere:

* the optimizer sees only the adapters (the base has ``requires_grad=False``);
* the KL reference is the same model with its adapters switched off (``adapters_disabled``):
  no second copy of the weights;
* an engine with its own copy of the weights (vllm) receives the merged weights
  ``W + (alpha / r) B A`` under the base model's names, streamed (``sampling_weights``);
* checkpoints hold the adapters (``adapter_model.safetensors``), and a run resumes by loading the
  base again and the adapters from the checkpoint; ``semrl export`` writes the merged model.

torch is imported where it is used: ``semrl eval`` checks a ``--model`` directory
(``is_adapter_checkpoint``) before torch loads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semrl.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from semrl.config.sections import ModelConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_NAME = "default"


def has_adapters(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "_hf_peft_config_loaded", False))


def is_adapter_checkpoint(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def _peft_config(model_cfg: Any) -> Any:  # Any: PEFT types lora_alpha int, the config keeps a float
    from peft import LoraConfig

    targets = list(model_cfg.lora_target_modules)
    return LoraConfig(
        r=model_cfg.lora_r,
        lora_alpha=model_cfg.lora_alpha,
        lora_dropout=model_cfg.lora_dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        bias="none",
    )


def add_adapters(
    model: PreTrainedModel, model_cfg: ModelConfig, checkpoint: str | None = None, seed: int = 0
) -> None:
    """Give ``model`` the adapters of ``model.lora_*``: fresh ones (A drawn from ``seed``, the same on
    every process; B = 0, so the model starts as the base), or the trained ones of ``checkpoint``.
    Only the adapters are trainable."""
    import torch

    embeddings = {model.get_input_embeddings(), model.get_output_embeddings()}
    if checkpoint is not None:
        model.load_adapter(checkpoint, adapter_name=ADAPTER_NAME, is_trainable=True)
    else:
        try:
            with torch.random.fork_rng(devices=[]):  # not from a process's own stream (seeded with its rank)
                torch.manual_seed(seed)
                model.add_adapter(_peft_config(model_cfg), adapter_name=ADAPTER_NAME)
        except ValueError as err:  # PEFT: a target module that the model does not have
            raise ConfigError(f"config key 'model.lora_target_modules': {err}") from err
    wrapped = [
        name for name, module in model.named_modules() if getattr(module, "base_layer", None) in embeddings
    ]
    if wrapped:
        raise ConfigError(
            "config key 'model.lora_target_modules' puts adapters "
            f"on {wrapped}: the embeddings and the LM head "
            "cannot take them (log-probs are computed from the head's weight); name decoder modules only"
        )


@contextmanager
def adapters_disabled(model: PreTrainedModel) -> Iterator[None]:
    """The base model: the adapters switched off for the duration (the KL reference under LoRA)."""
    if not has_adapters(model):
        yield
        return
    model.disable_adapters()
    try:
        yield
    finally:
        model.enable_adapters()


def sampling_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What an engine holding its own copy of the weights loads, one tensor at a time, under the base
    model's own names: the model's tensors themselves (no copy), and under LoRA each adapted weight
    merged, ``W + (alpha / r) B A``, when its turn comes, so that one merged copy exists at a time.
    The model is left unchanged."""
    if not has_adapters(model):
        yield from model.state_dict().items()
        return
    import torch
    from peft.tuners.lora import LoraLayer

    layers = model.named_modules()
    adapted: dict[str, Any] = {  # LoRA layers by the name of the weight they adapt
        f"{name}.base_layer.weight": m for name, m in layers if isinstance(m, LoraLayer)
    }
    for key, tensor in model.state_dict().items():
        if ".lora_" in key:
            continue
        layer = adapted.get(key)
        if layer is not None:
            with torch.no_grad():
                tensor = tensor + layer.get_delta_weight(ADAPTER_NAME).to(tensor.dtype)
        yield key.replace(".base_layer.", "."), tensor
