"""Tree-packed forward: every token of a prompt's prefix tree computed once.

A group of G chains that share prefixes (ROSE trees) is laid out as one packed segment
``[prompt | chain 0 | chain 1's own tokens | ...]``: each chain contributes only the tokens after
its branch point; segments of several groups may share a row. Each token sees exactly its
ancestors (the prompt, the shared prefix it continues, and its own chain's earlier tokens), a rule
held in memory linear in the tokens and computed by ``semrl.update.tree_attention``; position ids restart
so every token keeps the position it has in its own chain. The log-probs, entropies and losses
equal those of the padded per-chain layout (``semrl.update.forward``), while a shared prefix goes through
the model once. Independent samples are the special case of a tree without branches (every
chain's parent is -1), which packs a micro-batch without padding waste.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from semrl.rollout.tree import ChainTree
from semrl.update.forward import final_hidden_states, head_logprobs
from semrl.update.lm_head import DEFAULT_LOGITS_CHUNK
from semrl.update.tree_attention import NEVER, TreeLayout, mask_placeholder, use_tree_attention

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class PackedBatch:
    """B packed rows of width S holding N chains of response width R.

    Attributes:
        input_ids: (B, S) token ids, pad where a row is shorter than S.
        layout: who sees whom (``semrl.update.tree_attention.TreeLayout``), in memory linear in S.
        row: (N,) the packed row holding chain n.
        predictor: (N, R) column whose logits predict response token t of chain n; -1 on padding.
        targets: (N, R) response token ids (pad on padding).
        response_mask: (N, R) 1 on response tokens.
        real: (B, S) bool, False on padding.
    """

    input_ids: torch.Tensor
    layout: TreeLayout
    row: torch.Tensor
    predictor: torch.Tensor
    targets: torch.Tensor
    response_mask: torch.Tensor
    real: torch.Tensor

    @property
    def position_ids(self) -> torch.Tensor:
        """(B, S) position of each token in its own chain."""
        return self.layout.position_ids

    @property
    def packed_tokens(self) -> int:
        """Real (non-pad) tokens in the packed rows."""
        return int(self.real.sum())


@dataclass
class _PackedTree:
    ids: list[int]
    positions: list[int]
    segments: list[int]  # 0: the prompt, 1 + c: chain c's own tokens
    cutoff: list[list[int]]  # (1 + G, 1 + G), see semrl.update.tree_attention
    slots: list[list[int]]  # column of every response token, per chain


def _pack_tree(prompt: list[int], responses: list[list[int]], tree: ChainTree) -> _PackedTree:
    p = len(prompt)
    n_segments = 1 + len(responses)
    packed = _PackedTree(
        list(prompt), list(range(p)), [0] * p, [[0] * n_segments for _ in range(n_segments)], []
    )
    packed.cutoff[0][0] = NEVER
    for c, response in enumerate(responses):
        parent, k = tree.parents[c], tree.branch_positions[c]
        if parent >= 0 and response[:k] != responses[parent][:k]:
            raise ValueError(f"chain {c} does not start with the first {k} tokens of its parent {parent}")
        start = k if parent >= 0 else 0
        if parent >= 0:  # what the parent sees, up to the branch point
            seen = [min(cut, p + k) for cut in packed.cutoff[1 + parent]]
        else:
            seen = [p] + [0] * len(responses)
        seen[1 + c] = NEVER
        packed.cutoff[1 + c] = seen
        own = packed.slots[parent][:start] if parent >= 0 else []
        for t in range(start, len(response)):
            own.append(len(packed.ids))
            packed.ids.append(response[t])
            packed.positions.append(p + t)
            packed.segments.append(1 + c)
        packed.slots.append(own)
    return packed


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
    packed = [_pack_tree(p, r, t) for p, r, t in zip(prompts, responses, trees, strict=True)]
    budget = row_tokens if row_tokens is not None else max(len(t.ids) for t in packed)
    row_of: list[int] = []
    offset_of: list[int] = []
    row_lengths: list[int] = []
    for tree in packed:  # first fit, in order
        if not row_lengths or row_lengths[-1] + len(tree.ids) > budget:
            row_lengths.append(0)
        row_of.append(len(row_lengths) - 1)
        offset_of.append(row_lengths[-1])
        row_lengths[-1] += len(tree.ids)
    width, n_rows = max(row_lengths), len(row_lengths)
    # segments: each tree's, then one per row for its padding (pads see earlier pads: no empty row)
    first_segment = torch.tensor([0] + [len(t.cutoff) for t in packed]).cumsum(0).tolist()
    n_segments = first_segment[-1] + n_rows
    input_ids = torch.full((n_rows, width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((n_rows, width), dtype=torch.long)
    segment = (first_segment[-1] + torch.arange(n_rows))[:, None].repeat(1, width)
    cutoff = torch.zeros((n_segments, n_segments), dtype=torch.long)
    cutoff[first_segment[-1] :, first_segment[-1] :].fill_diagonal_(NEVER)
    for b, tree in enumerate(packed):
        tree_row, at, first = row_of[b], offset_of[b], first_segment[b]
        span = slice(at, at + len(tree.ids))
        input_ids[tree_row, span] = torch.tensor(tree.ids)
        position_ids[tree_row, span] = torch.tensor(tree.positions)
        segment[tree_row, span] = first + torch.tensor(tree.segments)
        cutoff[first : first + len(tree.cutoff), first : first + len(tree.cutoff)] = torch.tensor(tree.cutoff)
    real = torch.arange(width)[None, :] < torch.tensor(row_lengths)[:, None]
    for tree_row, length in enumerate(row_lengths):
        position_ids[tree_row, length:] = torch.arange(width - length)
    chains = [(b, c, r) for b, group in enumerate(responses) for c, r in enumerate(group)]
    r_width = max(1, max(len(r) for _, _, r in chains))
    row = torch.tensor([row_of[b] for b, _, _ in chains], dtype=torch.long)
    predictor = torch.full((len(chains), r_width), -1, dtype=torch.long)
    targets = torch.full((len(chains), r_width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((len(chains), r_width), dtype=torch.long)
    for n, (b, c, response) in enumerate(chains):
        if not response:
            continue
        # the last prompt column predicts token 0, the column of token t - 1 predicts token t
        columns = [len(prompts[b]) - 1, *packed[b].slots[c][: len(response) - 1]]
        predictor[n, : len(response)] = offset_of[b] + torch.tensor(columns)
        targets[n, : len(response)] = torch.tensor(response)
        response_mask[n, : len(response)] = 1
    return PackedBatch(
        input_ids, TreeLayout(position_ids, segment, cutoff), row, predictor, targets, response_mask, real
    )


def packed_response_logprobs(
    model: PreTrainedModel,
    batch: PackedBatch,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_size: int = DEFAULT_LOGITS_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, R) log-probs of every chain's response tokens and optionally their entropies (no
    gradient), equal to ``semrl.update.forward.response_logprobs`` on the padded chains."""
    device = next(model.parameters()).device
    use_tree_attention(model)
    hidden = final_hidden_states(
        model,
        input_ids=batch.input_ids.to(device),
        attention_mask=mask_placeholder(batch.input_ids.shape[0], device),
        position_ids=batch.position_ids.to(device),
        tree=batch.layout.to(device),
    )  # (B, S, D)
    # chains share the tokens of a common prefix: each (row, column, target) goes through the head once
    keep = batch.response_mask.bool()
    predictions = torch.stack(
        [batch.row[:, None].expand_as(keep)[keep], batch.predictor[keep], batch.targets[keep]], 1
    )
    unique, inverse = torch.unique(predictions, dim=0, return_inverse=True)
    unique, inverse, keep = unique.to(device), inverse.to(device), keep.to(device)
    logp_unique, entropy_unique = head_logprobs(
        model,
        hidden[unique[:, 0], unique[:, 1]][None],
        unique[None, :, 2],
        torch.ones_like(unique[None, :, 2]),
        temperature,
        with_entropy,
        chunk_size,
    )
    logp = torch.zeros(keep.shape, dtype=torch.float32, device=device)
    logp[keep] = logp_unique[0, inverse]
    entropy = None
    if entropy_unique is not None:
        entropy = torch.zeros(keep.shape, dtype=torch.float32, device=device)
        entropy[keep] = entropy_unique[0, inverse]
    return logp, entropy


def supports_packing(model: torch.nn.Module) -> bool:
    """Whether tree attention is exact for the model: a decoder whose attention goes through
    transformers' attention interface with position ids, and uses neither a sliding window nor
    soft-capped scores (which ``semrl.update.tree_attention`` does not apply)."""
    config = model.config
    sliding = getattr(config, "sliding_window", None) is not None and getattr(
        config, "use_sliding_window", True
    )
    return (
        hasattr(model, "model")
        and hasattr(model, "lm_head")
        and getattr(config, "model_type", "")
        in {"llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "olmo", "olmo2"}
        and not sliding
        and getattr(config, "attn_logit_softcapping", None) is None
    )


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
            if tree is not None and parent >= 0 and parent_row in local:
                parents.append(local[parent_row])
                positions.append(tree.branch_positions[chain])
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
