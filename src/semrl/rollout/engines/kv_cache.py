"""Hugging Face KV caches as semrl's engines hand them around: the forward keyword that passes one,
left-padded batches of ``PrefixCache`` rows, and one row's cache cut out of a batch (the hf engine and
the row loop share them)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from semrl.rollout.engines.base import KVHandle


@dataclass
class PrefixCache(KVHandle):
    """Key/value states of one sequence's first ``length`` context tokens, for every layer: the hf
    engine's ``KVHandle``, a copy that the hf engine and the row loop open.

    keys[l], values[l]: (num_kv_heads, length, head_dim). A continuation from a prefix hands the
    cache of its parent chain to the engine, which then feeds only the last context token instead
    of re-encoding prompt + prefix (what vLLM's prefix caching does for the ROSE code).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.keys[0].shape[-2] if self.keys else 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def with_cache(model: torch.nn.Module, cache: DynamicCache) -> dict[str, DynamicCache]:
    """The forward keyword that hands ``model`` its KV cache: ``cache`` from transformers 5.2x on,
    where ``past_key_values`` warns (a FutureWarning on every call) and goes in 5.40; before,
    ``past_key_values``."""
    model_class = type(model)
    if model_class not in _CACHE_KEYWORD:
        parameters = inspect.signature(model_class.forward).parameters
        _CACHE_KEYWORD[model_class] = "cache" if "cache" in parameters else "past_key_values"
    return {_CACHE_KEYWORD[model_class]: cache}


_CACHE_KEYWORD: dict[type[torch.nn.Module], str] = {}


def last_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache: DynamicCache,
) -> torch.Tensor:
    """(rows, V) float32 logits at each row's last position, from one forward of ``input_ids``
    (rows, T) after ``cache``, which the forward extends in place; the LM head runs on that position
    only. Every tensor on the model's device."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        **with_cache(model, cache),
        use_cache=True,
        logits_to_keep=1,
    )
    logits: torch.Tensor = out.logits[:, -1, :].float()
    return logits


def batched_cache(caches: list[PrefixCache | None], lengths: list[int], device: torch.device) -> DynamicCache:
    """Left-pad the first ``lengths[i]`` cached tokens of each row into one (B, H, W, D) cache per layer."""
    width = max(lengths)
    template = next((c for c in caches if c is not None and c.length), None)
    if width == 0 or template is None:
        return DynamicCache()
    layers = []
    for layer in range(len(template.keys)):
        heads, _, dim = template.keys[layer].shape
        dtype = template.keys[layer].dtype
        keys = torch.zeros((len(caches), heads, width, dim), dtype=dtype, device=device)
        values = torch.zeros_like(keys)
        for i, (cache, n) in enumerate(zip(caches, lengths, strict=True)):
            if n and cache is not None:  # a row with cached tokens has a cache
                keys[i, :, width - n :] = cache.keys[layer][:, :n]
                values[i, :, width - n :] = cache.values[layer][:, :n]
        layers.append((keys, values))
    return DynamicCache(ddp_cache_data=layers)


def row_cache(cache: DynamicCache, row: int, row_attention: torch.Tensor) -> PrefixCache:
    """The unpadded cache of one batch row, as contiguous copies (the padding columns dropped)."""
    valid = row_attention.bool()
    layers: list[Any] = list(cache.layers)  # attention layers, each with keys and values
    keys = [layer.keys[row][:, valid].clone() for layer in layers]
    values = [layer.values[row][:, valid].clone() for layer in layers]
    return PrefixCache(keys, values)
