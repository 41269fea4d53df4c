"""Attention over packed prefix trees in memory linear in the tokens (docs/algorithms.md "Tree packing").

Visibility is described per token, never as an (S, S) mask. Every token belongs to a *segment*: a
tree's prompt, one chain's own tokens (those after its branch point) or a row's padding. Key ``k`` is
visible to query ``q`` iff

    position[k] <= position[q]  and  position[k] < cutoff[segment[q], segment[k]]

where ``cutoff[a, b]`` is where the path from the tree's root to segment ``a`` leaves segment ``b``:
the prompt's length for the prompt, the branch position for an ancestor chain, "never" (a large
number) for the segment itself, 0 for a segment that is not an ancestor (another branch, another tree).
Positions are positions within each token's own chain, so the first rule is causality.

Two exact kernels read this description:
- CPU (and any device without FlexAttention's backward): query blocks of ``CPU_QUERY_BLOCK`` columns,
  each attending with ``scaled_dot_product_attention`` to only the keys some query of the block sees
  (its ancestors, gathered), under a (block, keys) mask built on the fly. With gradients, a block
  with more than ``KEPT_KEYS_PER_QUERY`` keys per query runs under activation checkpointing, so its
  gathered keys and mask are recomputed in backward, not kept: what a layer keeps for backward
  stays linear in the tokens.
- CUDA: FlexAttention with a ``BlockMask`` built from the same plan at 128 x 128 blocks (only blocks
  holding a visible pair are computed; fully visible blocks skip the mask) and the rule above as its
  ``mask_mod``. Chosen over flash-attention's varlen kernel, which can only express causal attention
  within independent sequences: a tree would need every chain's ancestor keys copied into its sequence.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

NEVER = 2**31 - 1  # cutoff of a segment for itself: causality alone decides
CPU_QUERY_BLOCK = 256
KEPT_KEYS_PER_QUERY = 4
FLEX_BLOCK = 128  # FlexAttention's default block size


@dataclass
class QueryBlock:
    """Queries ``start:end`` of row ``row`` and the (K,) columns any of them sees, ascending."""

    row: int
    start: int
    end: int
    keys: torch.Tensor


@dataclass
class TreeLayout:
    """Who sees whom in B packed rows of width S.

    Attributes:
        position_ids: (B, S) position of each token within its own chain.
        segment: (B, S) segment of each token, numbered across the whole batch.
        cutoff: (NSEG, NSEG) see the module docstring.
    """

    position_ids: torch.Tensor
    segment: torch.Tensor
    cutoff: torch.Tensor
    _plans: dict[int, list[QueryBlock]] = field(default_factory=dict, repr=False)  # by block size
    _block_mask: Any = field(default=None, repr=False)

    def visible(
        self, row: int, queries: slice = slice(None), keys: slice | torch.Tensor = slice(None)
    ) -> torch.Tensor:
        """(Q, K) bool: key visible to query, for the chosen columns of one row."""
        pos, seg = self.position_ids[row], self.segment[row]
        pos_q, seg_q, pos_k, seg_k = pos[queries], seg[queries], pos[keys], seg[keys]
        return (pos_k[None, :] <= pos_q[:, None]) & (
            pos_k[None, :] < self.cutoff[seg_q[:, None], seg_k[None, :]]
        )

    def dense_visible(self) -> torch.Tensor:
        """(B, S, S) bool visibility: for reference checks only, it is the S^2 structure this avoids."""
        return torch.stack([self.visible(b) for b in range(self.position_ids.shape[0])])

    def to(self, device: torch.device) -> TreeLayout:
        if self.position_ids.device == device:
            return self
        return TreeLayout(self.position_ids.to(device), self.segment.to(device), self.cutoff.to(device))

    def query_blocks(self, block: int) -> list[QueryBlock]:
        """Queries in blocks of ``block`` columns, each with the keys it needs (computed once per
        layout and block size, then shared by every layer)."""
        if block not in self._plans:
            plan = []
            for row in range(self.position_ids.shape[0]):
                for start in range(0, self.position_ids.shape[1], block):
                    end = min(start + block, self.position_ids.shape[1])
                    # a tree's tokens come after their ancestors, so no query sees a later column
                    seen = self.visible(row, slice(start, end), slice(0, end)).any(0)
                    plan.append(QueryBlock(row, start, end, seen.nonzero().flatten()))
            self._plans[block] = plan
        return self._plans[block]

    def structure_bytes(self, block: int | None = None) -> int:
        """Bytes the description and the key plan hold (what the tree costs beyond the model's own
        activations)."""
        plan = self.query_blocks(block or CPU_QUERY_BLOCK)
        tensors = [self.position_ids, self.segment, self.cutoff, *(b.keys for b in plan)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def block_mask(self) -> Any:
        """FlexAttention ``BlockMask`` of the layout (built once)."""
        from torch.nn.attention.flex_attention import BlockMask

        if self._block_mask is None:
            rows, width = self.position_ids.shape
            n_blocks = -(-width // FLEX_BLOCK)
            partial = torch.zeros(rows, n_blocks, n_blocks, dtype=torch.bool, device=self.position_ids.device)
            full = torch.zeros_like(partial)
            for query_block in self.query_blocks(FLEX_BLOCK):
                q_block = query_block.start // FLEX_BLOCK
                seen = self.visible(
                    query_block.row, slice(query_block.start, query_block.end), slice(0, query_block.end)
                )
                for k_block in (query_block.keys // FLEX_BLOCK).unique().tolist():
                    tile = seen[:, k_block * FLEX_BLOCK : (k_block + 1) * FLEX_BLOCK]
                    is_full = bool(tile.all()) and tile.shape == (FLEX_BLOCK, FLEX_BLOCK)
                    (full if is_full else partial)[query_block.row, q_block, k_block] = True

            def kv_blocks(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                counts = flags.sum(-1, dtype=torch.int32)[:, None]  # (B, 1, QB)
                order = (
                    flags.to(torch.int8)
                    .argsort(dim=-1, descending=True, stable=True)
                    .to(torch.int32)[:, None]
                )
                return counts, order

            pos, seg, cutoff = self.position_ids, self.segment, self.cutoff

            def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
                return (pos[b, k] <= pos[b, q]) & (pos[b, k] < cutoff[seg[b, q], seg[b, k]])

            self._block_mask = BlockMask.from_kv_blocks(
                *kv_blocks(partial),
                *kv_blocks(full),
                BLOCK_SIZE=FLEX_BLOCK,
                mask_mod=mask_mod,
                seq_lengths=(width, width),
            )
        return self._block_mask


def _block_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: TreeLayout,
    block: QueryBlock,
    scaling: float | None,
    dropout: float,
) -> torch.Tensor:
    """(1, H, Q, D) attention of one query block to its gathered keys."""
    mask = layout.visible(block.row, slice(block.start, block.end), block.keys)
    return F.scaled_dot_product_attention(
        query,
        key.index_select(2, block.keys),
        value.index_select(2, block.keys),
        attn_mask=mask[None, None],
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )


def blockwise_tree_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: TreeLayout,
    scaling: float | None = None,
    dropout: float = 0.0,
    block: int | None = None,
) -> torch.Tensor:
    """(B, Hq, S, D) queries, (B, Hkv, S, D) keys and values -> (B, S, Hq, D) outputs, in query
    blocks of ``block`` columns (default ``CPU_QUERY_BLOCK``)."""
    block = block or CPU_QUERY_BLOCK
    rows: list[list[torch.Tensor]] = [[] for _ in range(query.shape[0])]
    with_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    for qb in layout.query_blocks(block):
        args = (
            query[qb.row : qb.row + 1, :, qb.start : qb.end],
            key[qb.row : qb.row + 1],
            value[qb.row : qb.row + 1],
            layout,
            qb,
            scaling,
            dropout,
        )
        # a block keeps its gathered keys for backward only while they are few per query, so what is
        # kept stays linear in the tokens; long ancestries are recomputed instead
        recompute = with_grad and len(qb.keys) > KEPT_KEYS_PER_QUERY * (qb.end - qb.start)
        out = (
            checkpoint(_block_attention, *args, use_reentrant=False) if recompute else _block_attention(*args)
        )
        rows[qb.row].append(out)
    return torch.cat([torch.cat(parts, dim=2) for parts in rows]).transpose(1, 2).contiguous()


_compiled_flex: Callable[..., torch.Tensor] | None = None


def flex_tree_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: TreeLayout,
    scaling: float | None = None,
) -> torch.Tensor:
    """FlexAttention over the layout's ``BlockMask`` -> (B, S, Hq, D). Compiled on CUDA (uncompiled
    FlexAttention is a slow reference); eager elsewhere, where it has no backward."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    kernel: Callable[..., Any] = flex_attention
    if query.is_cuda:
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        kernel = _compiled_flex
    out = kernel(
        query,
        key,
        value,
        block_mask=layout.block_mask(),
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return cast("torch.Tensor", out.transpose(1, 2).contiguous())


def tree_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    tree: TreeLayout | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: tree attention when the forward got ``tree=``, otherwise
    the model's own implementation (padded rows, generation)."""
    if tree is None:
        fallback = _fallback(module)
        output = fallback(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
        return cast("tuple[torch.Tensor, None]", output)
    unsupported = [k for k in ("sliding_window", "softcap") if kwargs.get(k) is not None]
    if unsupported:
        raise ValueError(f"tree attention does not apply {', '.join(unsupported)}; set trainer.packing=none")
    tree = tree.to(query.device)
    if query.is_cuda and dropout == 0.0:
        return flex_tree_attention(query, key, value, tree, scaling), None
    return blockwise_tree_attention(query, key, value, tree, scaling, dropout), None


_PREFIX = "semrl_tree_"


def _fallback(module: torch.nn.Module) -> Callable[..., Any]:
    from transformers import AttentionInterface

    config: Any = module.config
    name = config._attn_implementation.removeprefix(_PREFIX)
    if name == "eager":
        return cast("Callable[..., Any]", sys.modules[type(module).__module__].eager_attention_forward)
    return cast("Callable[..., Any]", AttentionInterface._global_mapping[name])


def use_tree_attention(model: torch.nn.Module) -> None:
    """Route the model's attention through ``tree_attention_forward`` (idempotent). Calls without
    ``tree=`` behave exactly as before: same attention function, same mask construction."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    config: Any = model.config
    current = config._attn_implementation
    if current.startswith(_PREFIX):
        return
    if current not in ("sdpa", "eager"):
        raise ValueError(
            f"trainer.packing=tree needs the model's attention to be 'sdpa' or 'eager', not '{current}'; "
            "set trainer.packing=none or load the model with attn_implementation='sdpa'"
        )
    AttentionInterface.register(_PREFIX + current, tree_attention_forward)
    AttentionMaskInterface.register(_PREFIX + current, ALL_MASK_ATTENTION_FUNCTIONS[current])
    config._attn_implementation = _PREFIX + current


def mask_placeholder(rows: int, device: torch.device) -> torch.Tensor:
    """A (B, 1, 0, 0) attention mask: transformers passes a 4D mask through untouched, so no dense
    mask is built for a packed forward (the layout travels as ``tree=``)."""
    return torch.zeros((rows, 1, 0, 0), dtype=torch.bool, device=device)
