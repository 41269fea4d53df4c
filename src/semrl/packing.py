"""Tree-packed forward: every token of a prompt's prefix tree computed once.

A group of G chains that share prefixes (ROSE trees) is laid out as one packed segment
``[prompt | chain 0 | chain 1's own tokens | ...]``: each chain contributes only the tokens after
its branch point; segments of several groups may share a row. A float additive 4D attention mask lets each token see exactly its ancestors
(the prompt, the shared prefix it continues, and its own chain's earlier tokens), and position
ids restart so every token keeps the position it has in its own chain. The log-probs, entropies
and losses equal those of the padded per-chain layout (``semrl.forward``), while a shared prefix
goes through the model once. Independent samples are the special case of a tree without branches
(every chain's parent is -1), which packs a micro-batch without padding waste.

Mask format: docs/algorithms.md "Tree packing" (a boolean 4D mask is silently wrong with
eager attention; 0 / finfo.min floats are right for eager and sdpa).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from semrl.forward import final_hidden_states, head_logprobs
from semrl.lm_head import DEFAULT_LOGITS_CHUNK
from semrl.precision import active_dtype
from semrl.tree import ChainTree


@dataclass
class PackedBatch:
    """B packed rows of width S holding N chains of response width R.

    Attributes:
        input_ids: (B, S) token ids, pad where a row is shorter than S.
        position_ids: (B, S) position of each token in its own chain.
        visible: (B, S, S) bool, key j visible to query i (ancestors and itself).
        row: (N,) the packed row holding chain n.
        predictor: (N, R) column whose logits predict response token t of chain n; -1 on padding.
        targets: (N, R) response token ids (pad on padding).
        response_mask: (N, R) 1 on response tokens.
        real: (B, S) bool, False on padding.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    visible: torch.Tensor
    row: torch.Tensor
    predictor: torch.Tensor
    targets: torch.Tensor
    response_mask: torch.Tensor
    real: torch.Tensor

    def attention_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """(B, 1, S, S) additive mask: 0 where visible, the dtype's most negative value elsewhere."""
        mask = torch.full(self.visible.shape, torch.finfo(dtype).min, dtype=dtype)
        return mask.masked_fill(self.visible, 0.0)[:, None]

    @property
    def packed_tokens(self) -> int:
        """Real (non-pad) tokens in the packed rows."""
        return int(self.real.sum())


def _pack_row(prompt: list[int], responses: list[list[int]], tree: ChainTree) -> tuple[list[int], list[int], list[list[int]], list[list[int]]]:
    """One tree: (ids, positions, ancestors per column, slot of every response token per chain)."""
    ids, positions = list(prompt), list(range(len(prompt)))
    ancestors: list[list[int]] = [list(range(i + 1)) for i in range(len(prompt))]
    slots: list[list[int]] = []
    for c, response in enumerate(responses):
        parent, k = tree.parents[c], tree.branch_positions[c]
        start = k if parent >= 0 else 0
        if parent >= 0 and response[:k] != responses[parent][:k]:
            raise ValueError(f"chain {c} does not start with the first {k} tokens of its parent {parent}")
        own = slots[parent][:start] if parent >= 0 else []
        for t in range(start, len(response)):
            column = len(ids)
            before = ancestors[own[-1]] if own else ancestors[len(prompt) - 1]
            ids.append(response[t])
            positions.append(len(prompt) + t)
            ancestors.append([*before, column])
            own.append(column)
        slots.append(own)
    return ids, positions, ancestors, slots


def pack_trees(
    prompts: list[list[int]],
    responses: list[list[list[int]]],
    trees: list[ChainTree],
    pad_token_id: int,
    row_tokens: int | None = None,
) -> PackedBatch:
    """Pack trees into rows. ``prompts[b]`` is tree b's prompt, ``responses[b][c]`` chain c's
    response ids (full, shared prefix included), ``trees[b]`` its parents and branch positions.

    ``row_tokens``: trees share a row, in order, while their tokens fit (a longer tree gets a row of
    its own); a token never sees another tree's tokens and positions restart in each tree, so values
    are those of one tree per row. None: as many tokens as the longest tree, so no row grows wider
    than one tree per row would make it, and shorter trees fill the padding.
    """
    packed = [_pack_row(p, r, t) for p, r, t in zip(prompts, responses, trees, strict=True)]
    budget = row_tokens if row_tokens is not None else max(len(ids) for ids, _, _, _ in packed)
    row_of, offset_of, row_lengths = [], [], []
    for ids, _, _, _ in packed:  # first fit, in order
        if not row_lengths or row_lengths[-1] + len(ids) > budget:
            row_lengths.append(0)
        row_of.append(len(row_lengths) - 1)
        offset_of.append(row_lengths[-1])
        row_lengths[-1] += len(ids)
    width = max(row_lengths)
    chains = [(b, c, r) for b, group in enumerate(responses) for c, r in enumerate(group)]
    r_width = max(1, max(len(r) for _, _, r in chains))
    input_ids = torch.full((len(row_lengths), width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(row_lengths), width), dtype=torch.long)
    visible = torch.zeros((len(row_lengths), width, width), dtype=torch.bool)
    for b, (ids, positions, ancestors, _) in enumerate(packed):
        row, at = row_of[b], offset_of[b]
        input_ids[row, at : at + len(ids)] = torch.tensor(ids)
        position_ids[row, at : at + len(ids)] = torch.tensor(positions)
        for i, seen in enumerate(ancestors):
            visible[row, at + i, [at + j for j in seen]] = True
    real = torch.arange(width)[None, :] < torch.tensor(row_lengths)[:, None]
    for row, length in enumerate(row_lengths):
        pad = torch.arange(length, width)
        visible[row, pad, pad] = True  # pads see themselves only: no all-masked row, no NaN
    row = torch.tensor([row_of[b] for b, _, _ in chains], dtype=torch.long)
    predictor = torch.full((len(chains), r_width), -1, dtype=torch.long)
    targets = torch.full((len(chains), r_width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((len(chains), r_width), dtype=torch.long)
    for n, (b, c, response) in enumerate(chains):
        slots = packed[b][3][c]
        at = offset_of[b]
        last_prompt = len(prompts[b]) - 1
        for t in range(len(response)):
            predictor[n, t] = at + (last_prompt if t == 0 else slots[t - 1])
        if response:
            targets[n, : len(response)] = torch.tensor(response)
            response_mask[n, : len(response)] = 1
    return PackedBatch(input_ids, position_ids, visible, row, predictor, targets, response_mask, real)


def packed_response_logprobs(
    model: PreTrainedModel,
    batch: PackedBatch,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_size: int = DEFAULT_LOGITS_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, R) log-probs of every chain's response tokens and optionally their entropies (no
    gradient), equal to ``semrl.forward.response_logprobs`` on the padded chains."""
    device = next(model.parameters()).device
    hidden = final_hidden_states(
        model,
        input_ids=batch.input_ids.to(device),
        attention_mask=batch.attention_mask(active_dtype(next(model.parameters()))).to(device),
        position_ids=batch.position_ids.to(device),
    )  # (B, S, D)
    columns = batch.predictor.clamp(min=0).to(device)
    rows = batch.row.to(device)[:, None].expand_as(columns)
    return head_logprobs(
        model, hidden[rows, columns], batch.targets.to(device), batch.response_mask.to(device), temperature,
        with_entropy, chunk_size,
    )


def supports_packing(model: PreTrainedModel) -> bool:
    """Whether the model takes a custom 4D attention mask in its forward and has an ``lm_head``
    (Llama-family decoders in transformers >= 4.40 do)."""
    return hasattr(model, "model") and hasattr(model, "lm_head") and getattr(
        model.config, "model_type", ""
    ) in {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "olmo2"}


def pack_rows(
    prompt_ids: list[list[int]],
    responses: list[list[int]],
    rows: list[int],
    group_size: int,
    trees: list[ChainTree] | None,
    pad_token_id: int,
) -> tuple[PackedBatch, list[int]]:
    """Pack the chosen rows of a rollout batch (any subset, any order).

    Rows of the same group with the same prompt go into one packed row; a chain keeps its tree
    parent when that parent is among the chosen rows and otherwise becomes a root carrying its
    whole response. Without trees every chain is a root, so the group still shares its prompt.

    Returns (packed batch, order): packed chain n is row ``rows[order[n]]``, so
    ``logp[order.index(i)]`` belongs to ``rows[i]``; use ``unpack_order(order)`` to gather.
    """
    buckets: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for i, row in enumerate(rows):
        buckets.setdefault((row // group_size, tuple(prompt_ids[row])), []).append(i)
    prompts, packed_responses, subtrees, order = [], [], [], []
    for (group, prompt), members in buckets.items():
        members.sort(key=lambda i: rows[i])
        local = {rows[i]: j for j, i in enumerate(members)}
        tree = trees[group] if trees is not None else None
        parents, positions = [], []
        for j, i in enumerate(members):
            chain = rows[i] - group * group_size
            parent = tree.parents[chain] if tree is not None else -1
            parent_row = group * group_size + parent
            if parent >= 0 and parent_row in local:
                parents.append(local[parent_row])
                positions.append(tree.branch_positions[chain])  # type: ignore[union-attr]
            else:
                parents.append(-1)
                positions.append(-1 if j == 0 else 0)
        chains = [responses[rows[i]] for i in members]
        prompts.append(list(prompt))
        packed_responses.append(chains)
        subtrees.append(ChainTree(tuple(parents), tuple(positions), tuple(len(c) for c in chains)))
        order.extend(members)
    return pack_trees(prompts, packed_responses, subtrees, pad_token_id), order


def unpack_order(order: list[int]) -> torch.Tensor:
    """Index that takes packed-chain tensors back to the caller's row order."""
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return inverse
