"""Log-probs and entropies of a rollout batch's responses under a model, padded or tree-packed
(the update's no-gradient passes), and the entropies an engine that does not compute them (vllm)
leaves to the trainer's forward."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from semrl.core.distributed import is_sharded
from semrl.errors import TrainingError
from semrl.models.precision import autocast_to
from semrl.rollout.batch import RolloutBatch
from semrl.rollout.engines.base import Generation
from semrl.rollout.sequences import make_sequence_batch
from semrl.update.forward import response_logprobs
from semrl.update.lm_head import DEFAULT_LOGITS_CHUNK
from semrl.update.packing import pack_rows, packed_response_logprobs, unpack_order


def rows_logprobs(
    model: Any,
    batch: RolloutBatch,
    idx: torch.Tensor,
    temperature: float,
    *,
    with_entropy: bool,
    packed: bool,
    chunk_size: int = DEFAULT_LOGITS_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Log-probs (n, r), entropies (n, r) or None, and response mask (n, r) of rows ``idx``.

    ``packed``: each prompt group's rows of ``idx`` go through the model as one row, shared prompt
    and tree prefixes computed once (``semrl.update.packing``); the same values as padded rows.
    ``chunk_size``: response tokens whose logits exist at once (``semrl.update.lm_head``).
    """
    if not packed:
        sub = batch.sequences.select(idx)
        logp, entropy = response_logprobs(model, sub, temperature, with_entropy, chunk_size)
        return logp, entropy, sub.response_mask.to(logp.device).float()
    rows = idx.tolist()
    packed_rows, order = pack_rows(
        batch.prompt_ids,
        [g.token_ids.tolist() for g in batch.generations],
        rows,
        batch.group_size,
        batch.trees(),
        batch.pad_token_id,
    )
    logp, entropy = packed_response_logprobs(model, packed_rows, temperature, with_entropy, chunk_size)
    back = unpack_order(order)
    mask = packed_rows.response_mask[back].to(logp.device).float()
    return logp[back], None if entropy is None else entropy[back], mask


def batch_logprobs(
    model: Any,
    batch: RolloutBatch,
    temperature: float,
    micro_batches: list[torch.Tensor],
    *,
    packed: bool,
    with_entropy: bool = False,
    chunk_size: int = DEFAULT_LOGITS_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, T) log-probs of every response token under ``model`` (old policy or reference), without
    gradient, one micro-batch of rows at a time; and (N, T) entropies with ``with_entropy``."""
    out = torch.zeros(batch.sequences.response_mask.shape)
    entropies = torch.zeros_like(out) if with_entropy else None
    model.eval()
    with torch.no_grad():
        for idx in micro_batches:
            logp, entropy, _ = rows_logprobs(
                model,
                batch,
                idx,
                temperature,
                with_entropy=with_entropy,
                packed=packed,
                chunk_size=chunk_size,
            )
            out[idx, : logp.shape[1]] = logp.cpu()
            if entropies is not None and entropy is not None:
                entropies[idx, : entropy.shape[1]] = entropy.float().cpu()
    return out, entropies


@torch.no_grad()
def with_sampling_entropy(
    model: Any,
    contexts: list[list[int]],
    generations: list[Generation],
    temperature: float,
    micro_batch_size: int = 8,
    compute_dtype: torch.dtype = torch.float32,
) -> list[Generation]:
    """``generations`` with their ``entropy``, new ``Generation`` objects for those that lack it (vllm):
    the full-vocabulary entropy of the tempered next-token distribution at each response position,
    from a forward pass of ``model`` (the weights that sampled them) in ``compute_dtype`` (the
    engine's). contexts[i]: the tokens before generations[i]. The given objects are left as they are."""
    out = list(generations)
    todo = [i for i, g in enumerate(generations) if g.entropy is None]
    if todo and is_sharded(model):
        raise TrainingError(
            f"{len(todo)} sampled chains came without their entropy record, and under trainer.fsdp the "
            "forward that would give it cannot run in one process's rollout (the weights are sharded "
            "across processes). Use rollout.vllm_sampler_entropy=true on rollout.engine=vllm, or "
            "trainer.fsdp=false"
        )
    was_training = model.training
    model.eval()
    for start in range(0, len(todo), micro_batch_size):
        rows = todo[start : start + micro_batch_size]
        batch = make_sequence_batch(  # pad id 0: padding is masked out of the forward
            [contexts[i] for i in rows], [generations[i].token_ids.tolist() for i in rows], 0
        )
        with autocast_to(compute_dtype, model):
            _, entropy = response_logprobs(
                model, batch, temperature if temperature > 0 else 1.0, with_entropy=True
            )
        assert entropy is not None
        for j, i in enumerate(rows):
            length = len(generations[i].token_ids)
            out[i] = replace(generations[i], entropy=entropy[j, :length].float().cpu())
    if was_training:
        model.train()
    return out
