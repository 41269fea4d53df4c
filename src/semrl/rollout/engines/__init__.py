"""Sampling engines (docs/engines.md): the shared types and the ``Engine`` interface
(``semrl.rollout.engines.base``), the ``hf`` engine (``semrl.rollout.engines.hf``), the ``vllm`` engine
(``semrl.rollout.engines.vllm``, imported only when it is used), and ``build_engine``, the one place
engines are made."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from semrl.rollout.engines.base import (
    Engine,
    EngineCost,
    EnginePowers,
    Generation,
    GenerationRequest,
    KVHandle,
    LookaheadRows,
    OnDone,
    OnTokens,
    RequestRecord,
    SamplingParams,
    eos_token_ids,
    join_generations,
    request_budget,
    require_power,
    sampling_params,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from semrl.config.sections import RolloutConfig

__all__ = [
    "Engine",
    "EngineCost",
    "EnginePowers",
    "Generation",
    "GenerationRequest",
    "LookaheadRows",
    "OnDone",
    "OnTokens",
    "KVHandle",
    "RequestRecord",
    "SamplingParams",
    "build_engine",
    "eos_token_ids",
    "join_generations",
    "request_budget",
    "require_power",
    "sampling_params",
]


def build_engine(
    kind: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    max_model_len: int,
    logprobs_top_k: int = 20,
    seed: int = 0,
    vllm_options: RolloutConfig | None = None,
    compute_dtype: torch.dtype | None = None,
    initial_weights: Iterable[tuple[str, torch.Tensor]] | None = None,
) -> Engine:
    """The engine named ``kind`` sampling from ``model``.

    Args:
        max_model_len: longest prompt + response any request will have (vllm sizes its cache by it).
        vllm_options: the ``rollout`` config section (``vllm_*`` keys), or None for the defaults.
        compute_dtype: the dtype sampling computes in (``model.dtype``): vllm holds its weights in
            it; hf autocasts to it when ``model`` holds wider (float32 master) weights. None: the
            model's own dtype. vllm on a GPU samples in ``rollout.vllm_dtype`` (default bfloat16).
        initial_weights: vllm: the stream its weights start from (a sharded model's gathered
            tensors); None: ``model``'s own.
    """
    eos = eos_token_ids(tokenizer, model)
    if kind == "hf":  # imported here: transformers' generation code loads only when an engine is made
        from semrl.rollout.engines.hf import HFEngine

        return HFEngine(model, eos, tokenizer.pad_token_id, batch_size, compute_dtype)
    if kind == "vllm":
        from semrl.rollout.engines.vllm import VLLMEngine
        from semrl.rollout.engines.vllm.start import VLLMSettings

        dtype = None if compute_dtype is None else str(compute_dtype).removeprefix("torch.")
        settings = VLLMSettings.from_options(
            vllm_options,
            max_model_len,
            batch_size,
            logprobs_top_k,
            seed,
            dtype,
            on_gpu=model.device.type == "cuda",
        )
        return VLLMEngine(model, eos, settings, initial_weights)
    raise ValueError(f"unknown engine '{kind}'; rollout.engine is 'hf' or 'vllm'")
