"""Log-probs and entropies of a rollout batch's responses under a model, padded or tree-packed; and
the entropies an engine that does not compute them (vllm) leaves to the trainer's forward."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from semrl.batch import RolloutBatch
from semrl.engines.base import Generation
from semrl.forward import make_sequence_batch, response_logprobs
from semrl.lm_head import DEFAULT_LOGITS_CHUNK
from semrl.packing import pack_rows, packed_response_logprobs, unpack_order
from semrl.precision import autocast_to


def rows_logprobs(
    model: Any, batch: RolloutBatch, idx: torch.Tensor, temperature: float, *, with_entropy: bool,
    packed: bool,
    chunk_size: int = DEFAULT_LOGITS_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Log-probs (n, r), entropies (n, r) or None, and response mask (n, r) of rows ``idx``.

    ``packed``: each prompt group's rows of ``idx`` go through the model as one row, shared prompt
    and tree prefixes computed once (``semrl.packing``); the same values as padded rows.
    ``chunk_size``: response tokens whose logits exist at once (``semrl.lm_head``).
    """
    if not packed:
        sub = batch.sequences.select(idx)
        logp, entropy = response_logprobs(model, sub, temperature, with_entropy, chunk_size)
        return logp, entropy, sub.response_mask.to(logp.device).float()
    rows = idx.tolist()
    packed_rows, order = pack_rows(
        batch.prompt_ids, [g.token_ids.tolist() for g in batch.generations], rows, batch.group_size,
        batch.trees(), batch.pad_token_id,
    )
    logp, entropy = packed_response_logprobs(model, packed_rows, temperature, with_entropy, chunk_size)
    back = unpack_order(order)
    mask = packed_rows.response_mask[back].to(logp.device).float()
    return logp[back], None if entropy is None else entropy[back], mask


def batch_logprobs(
    model: Any, batch: RolloutBatch, temperature: float, micro_batches: list[torch.Tensor], *, packed: bool,
    with_entropy: bool = False, chunk_size: int = DEFAULT_LOGITS_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, T) log-probs of every response token under ``model`` (old policy or reference), without
    gradient, one micro-batch of rows at a time; and (N, T) entropies with ``with_entropy``."""
    out = torch.zeros(batch.sequences.response_mask.shape)
    entropies = torch.zeros_like(out) if with_entropy else None
    model.eval()
    with torch.no_grad():
        for idx in micro_batches:
            logp, entropy, _ = rows_logprobs(
                model, batch, idx, temperature, with_entropy=with_entropy, packed=packed,
                chunk_size=chunk_size
            )
            out[idx, : logp.shape[1]] = logp.cpu()
            if entropies is not None and entropy is not None:
                entropies[idx, : entropy.shape[1]] = entropy.float().cpu()
    return out, entropies


@dataclass
class PolicyPasses:
    """The no-gradient forwards a step needs before its update; each (N, T) or None.

    Attributes:
        old_logp: the behaviour policy's log-probs (the weights that sampled), when the update takes
            more than one optimizer step; None: on-policy, the ratio is exactly 1.
        ref_logp: the reference model's log-probs, when a KL term or ``log_ref_kl`` needs them.
        sampling_entropy: full-vocabulary entropies at the sampling weights, when the engine gave none
            (vllm) and the old-policy pass runs anyway or a token selection needs them before the
            update; otherwise the update's first forward measures them.
        first_forward_rows: (N,) bool, the rows whose ``old_logp`` (and entropy) the update's first
            forward gives: the first mini-batch's, which no optimizer step precedes, so that forward
            runs at the sampling weights and its log-probs are the old ones (docs/algorithms.md,
            "Old log-probs"). None: the pass covered every row.
    """

    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    sampling_entropy: torch.Tensor | None = None
    first_forward_rows: torch.Tensor | None = None


def policy_passes(
    model: Any,
    ref_model: Any | None,
    batch: RolloutBatch,
    row_batches: Callable[[torch.Tensor], list[torch.Tensor]],
    *,
    temperature: float,
    packed: bool,
    chunk_size: int,
    on_policy: bool,
    sampling_entropy_before_update: bool,
    autocast: Callable[[], AbstractContextManager[Any]],
    reference_weights: Callable[[], AbstractContextManager[Any]],
    first_mini_batch: torch.Tensor | None = None,
) -> PolicyPasses:
    """Run the passes the step needs: old-policy log-probs unless ``on_policy`` (one optimizer step,
    pi_old = pi_theta), the reference's when there is a ``ref_model``, and rollout entropies when the
    batch lacks them and ``sampling_entropy_before_update`` (a token selection reads them) or an old-policy
    pass runs anyway. ``row_batches(rows)`` gives the micro-batches (row indices) of ``rows``
    (called only when a pass runs); ``autocast`` enters the trained model's compute dtype;
    ``reference_weights`` makes ``ref_model`` the reference (under LoRA, the trained model with its
    adapters off). ``first_mini_batch``: the rows of the update's first optimizer step; the
    old-policy pass leaves them to that step's forward, unless their entropies are needed before
    the update."""
    num_rows = len(batch.generations)
    fill = not batch.has_sampling_entropy and (not on_policy or sampling_entropy_before_update)
    passes = PolicyPasses()
    every_row = torch.arange(num_rows)
    if not on_policy or fill:
        old_rows = every_row
        if not on_policy and first_mini_batch is not None and not (fill and sampling_entropy_before_update):
            skipped = torch.zeros(num_rows, dtype=torch.bool)
            skipped[first_mini_batch] = True
            old_rows, passes.first_forward_rows = every_row[~skipped], skipped
        with autocast():
            logp, entropy = batch_logprobs(
                model, batch, temperature, row_batches(old_rows) if len(old_rows) else [], packed=packed,
                with_entropy=fill, chunk_size=chunk_size,
            )
        passes.old_logp = None if on_policy else logp
        passes.sampling_entropy = entropy
    if ref_model is not None:
        with reference_weights():
            passes.ref_logp = batch_logprobs(
                ref_model, batch, temperature, row_batches(every_row), packed=packed, chunk_size=chunk_size
            )[0]
    return passes


@dataclass
class MiniBatch:
    """The rows of one optimizer step and what their micro-batches share."""

    rows: torch.Tensor  # (n,) rows of the batch
    plan: list[torch.Tensor]  # positions into rows of each micro-batch
    selection: dict[str, torch.Tensor]  # the policy loss's per-token selection, (n, T) each
    num_tokens: int  # response tokens of the mini-batch over every process


@dataclass
class UpdateResult:
    """What an update returns: its metrics, and the (N, T) entropies its forwards measured at the
    sampling weights when the batch had none (vllm; ``FirstForward``)."""

    metrics: dict[str, float]
    sampling_entropy: torch.Tensor | None = None


@dataclass
class FirstForward:
    """What the update's forwards give before any optimizer step, when they run at the sampling
    weights: the old log-probs of the rows the old-policy pass left (the first mini-batch's), and
    the sampling entropies an engine without them (vllm) left to the trainer.

    Attributes:
        rows: (N,) bool, the rows still to take; None: none.
        entropy: (N, T) sampling entropies being filled, when the batch has none; else None.
    """

    rows: torch.Tensor | None
    entropy: torch.Tensor | None

    @classmethod
    def plan(cls, batch: RolloutBatch, passes: PolicyPasses) -> FirstForward:
        """Rows the passes left; on-policy without entropies (vllm, one optimizer step) and no pass
        that measured them, every row."""
        rows, entropy = passes.first_forward_rows, None
        if not batch.has_sampling_entropy:
            mask = batch.sequences.response_mask
            given = passes.sampling_entropy
            entropy = torch.zeros(mask.shape) if given is None else given * mask
            if rows is None and given is None:
                rows = torch.ones(len(batch.generations), dtype=torch.bool)
        return cls(None if rows is None else rows.clone(), entropy)

    def sampling_entropy(self, batch: RolloutBatch) -> torch.Tensor:
        """(N, T) sampling entropies as far as they are known: the engine's, or those the passes
        and the forwards so far measured (complete wherever a token selection reads them before
        the update, since the passes then measure every row)."""
        return batch.sampling_entropy if self.entropy is None else self.entropy

    def old_log_probs(
        self, passes: PolicyPasses, idx: torch.Tensor, logp: torch.Tensor, entropy: torch.Tensor | None
    ) -> torch.Tensor:
        """(n, r) old log-probs of rows ``idx`` whose forward gave ``logp`` (n, r) and ``entropy``.
        Rows still to take get their own log-probs as the old ones (kept in ``passes.old_logp`` for
        later epochs) and their entropies into ``self.entropy``; they are then taken. Without an
        old-policy pass (on-policy) the old log-probs are ``logp`` itself."""
        r, dev = logp.shape[1], logp.device
        old = logp.detach() if passes.old_logp is None else passes.old_logp[idx, :r].to(dev)
        here = torch.zeros(len(idx), dtype=torch.bool) if self.rows is None else self.rows[idx]
        if self.rows is None or not here.any():
            return old
        mine = here.to(dev)
        if passes.old_logp is not None:
            old = torch.where(mine[:, None], logp.detach(), old)
            passes.old_logp[idx[here], :r] = logp.detach()[mine].float().cpu()
        if self.entropy is not None and entropy is not None:
            self.entropy[idx[here], :r] = entropy.detach()[mine].float().cpu()
        self.rows[idx[here]] = False
        return old


def micro_batches(
    batch: RolloutBatch, rows: torch.Tensor, size: int, token_budget: int | None, packed: bool,
    agree: Callable[[int], int] = lambda count: count,
) -> list[torch.Tensor]:
    """Positions into ``rows`` of each micro-batch.

    Without a token budget: ``size`` rows at a time, in order. With one: units (rows, or with
    ``packed`` a group's consecutive rows) sorted by their tokens fill micro-batches whose tokens as
    the model sees them (units x the widest unit) stay within ``token_budget``, a longer unit
    alone. ``agree(count)`` returns the count every process uses (the largest: FSDP's collectives
    run once per forward on every process); the micro-batches with the most units are split until
    there are that many.
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
    wanted = agree(len(bins))
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
def fill_sampling_entropy(
    model: Any,
    contexts: list[list[int]],
    generations: list[Generation],
    temperature: float,
    micro_batch_size: int = 8,
    compute_dtype: torch.dtype = torch.float32,
) -> None:
    """Fill ``entropy`` of generations that lack it (vllm) with the full-vocabulary entropy of
    the tempered next-token distribution at each response position, from a forward pass of
    ``model`` (the weights that sampled them) in ``compute_dtype`` (the engine's).
    contexts[i]: the tokens before generations[i]."""
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
            generations[i].entropy = entropy[j, : len(generations[i].token_ids)].float().cpu()
    if was_training:
        model.train()
