"""An update's micro-batch plan (by rows or by a token budget) and its row orders."""

from __future__ import annotations

import torch

from semrl.rollout.batch import RolloutBatch


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
