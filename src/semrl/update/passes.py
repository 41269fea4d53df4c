"""Log-probs and entropies of a rollout batch's responses under a model, padded or tree-packed; the
micro-batch plan and row orders of an update; and the entropies an engine that does not compute them
(vllm) leaves to the trainer's forward."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

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


def micro_batches(
    batch: RolloutBatch,
    rows: torch.Tensor,
    size: int,
    token_budget: int | None,
    packed: bool,
    count: int | None = None,
) -> list[torch.Tensor]:
    """Positions into ``rows`` of each micro-batch.

    Without a token budget: ``size`` rows at a time, in order. With one: units (rows, or with
    ``packed`` a group's consecutive rows) sorted by their tokens fill micro-batches whose tokens as
    the model sees them (units x the widest unit) stay within ``token_budget``, a longer unit
    alone. ``count``: the number of micro-batches to make (the largest any process needs, which
    ``semrl.update.actor.Actor.micro_batch_plan`` agrees on); the micro-batches with the most units
    are split until there are that many.
    """
    if token_budget is None:
        return [torch.arange(start, min(start + size, len(rows))) for start in range(0, len(rows), size)]
    units: list[list[int]] = []
    for position, row in enumerate(rows.tolist()):
        if packed and units and rows[units[-1][0]] // batch.group_size == row // batch.group_size:
            units[-1].append(position)
        else:
            units.append([position])
    costs = [_unit_tokens(batch, [int(rows[p]) for p in unit], packed) for unit in units]
    bins: list[list[int]] = []
    widest = 0
    for u in sorted(range(len(units)), key=lambda u: costs[u]):
        if bins and (len(bins[-1]) + 1) * max(widest, costs[u]) > token_budget:
            bins.append([])
            widest = 0
        if not bins:
            bins.append([])
        bins[-1].append(u)
        widest = max(widest, costs[u])
    wanted = len(bins) if count is None else count
    if wanted > len(units):
        raise ValueError(
            f"trainer.micro_batch_tokens={token_budget}: another "
            f"process needs {wanted} micro-batches, this one "
            f"has {len(units)} rows or groups to split; raise trainer.micro_batch_tokens"
        )
    while len(bins) < wanted:
        largest = max(range(len(bins)), key=lambda b: len(bins[b]))
        half = len(bins[largest]) // 2
        bins.insert(largest + 1, bins[largest][half:])
        bins[largest] = bins[largest][:half]
    return [torch.tensor([p for u in b for p in units[u]]) for b in bins]


def _unit_tokens(batch: RolloutBatch, rows: list[int], packed: bool) -> int:
    """Tokens of one unit as the model sees it: prompt + response of a row, or a group's packed row
    (its prompt once, each chain's tokens after its branch point)."""
    lengths = [len(batch.generations[r].token_ids) for r in rows]
    if not packed:
        return len(batch.prompt_ids[rows[0]]) + lengths[0]
    trees = batch.trees()
    chains = {r % batch.group_size for r in rows}
    shared = 0
    if trees is not None:
        tree = trees[rows[0] // batch.group_size]
        shared = sum(tree.branch_positions[c] for c in chains if tree.parents[c] in chains)
    return len(batch.prompt_ids[rows[0]]) + sum(lengths) - shared


def shuffled_rows(
    total: int, group_size: int, whole_groups: bool, generator: torch.Generator
) -> torch.Tensor:
    """(total,) a random order of the batch's rows for one PPO epoch; with ``whole_groups`` (tree
    packing) the groups are shuffled and each keeps its rows together, so micro-batches share prefixes."""
    if not whole_groups:
        return torch.randperm(total, generator=generator)
    groups = torch.randperm(total // group_size, generator=generator)
    return (groups[:, None] * group_size + torch.arange(group_size)).flatten()


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
