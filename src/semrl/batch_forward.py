"""Log-probs and entropies of a rollout batch's responses under a model, padded or tree-packed."""

from __future__ import annotations

from typing import Any

import torch

from semrl.batch import RolloutBatch
from semrl.forward import response_logprobs
from semrl.packing import pack_rows, packed_response_logprobs, unpack_order


def rows_logprobs(
    model: Any, batch: RolloutBatch, idx: torch.Tensor, temperature: float, with_entropy: bool, packed: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Log-probs (n, r), entropies (n, r) or None, and response mask (n, r) of rows ``idx``.

    ``packed``: each prompt group's rows of ``idx`` go through the model as one row, shared prompt
    and tree prefixes computed once (``semrl.packing``); the same values as padded rows.
    """
    if not packed:
        sub = batch.sequences.select(idx)
        logp, entropy = response_logprobs(model, sub, temperature, with_entropy=with_entropy)
        return logp, entropy, sub.response_mask.to(logp.device).float()
    rows = idx.tolist()
    packed_rows, order = pack_rows(
        batch.prompt_ids, [g.token_ids.tolist() for g in batch.generations], rows, batch.group_size,
        batch.trees(), batch.pad_token_id,
    )
    logp, entropy = packed_response_logprobs(model, packed_rows, temperature, with_entropy=with_entropy)
    back = unpack_order(order)
    mask = packed_rows.response_mask[back].to(logp.device).float()
    return logp[back], None if entropy is None else entropy[back], mask


def batch_logprobs(
    model: Any, batch: RolloutBatch, temperature: float, micro_batch_size: int, packed: bool, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, T) log-probs of every response token under ``model`` (old policy or reference), without
    gradient, ``micro_batch_size`` rows at a time; and (N, T) entropies with ``with_entropy``."""
    out = torch.zeros(batch.sequences.response_mask.shape)
    entropies = torch.zeros_like(out) if with_entropy else None
    total = len(batch.generations)
    model.eval()
    with torch.no_grad():
        for start in range(0, total, micro_batch_size):
            idx = torch.arange(start, min(start + micro_batch_size, total))
            logp, entropy, _ = rows_logprobs(model, batch, idx, temperature, with_entropy, packed)
            out[idx, : logp.shape[1]] = logp.cpu()
            if entropies is not None and entropy is not None:
                entropies[idx, : entropy.shape[1]] = entropy.float().cpu()
    return out, entropies


def shuffled_rows(total: int, group_size: int, whole_groups: bool, generator: torch.Generator) -> torch.Tensor:
    """(total,) a random order of the batch's rows for one PPO epoch; with ``whole_groups`` (tree
    packing) the groups are shuffled and each keeps its rows together, so micro-batches share prefixes."""
    if not whole_groups:
        return torch.randperm(total, generator=generator)
    groups = torch.randperm(total // group_size, generator=generator)
    return (groups[:, None] * group_size + torch.arange(group_size)).flatten()
