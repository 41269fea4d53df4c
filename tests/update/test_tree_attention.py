"""Tree attention without an S x S mask equals dense masked attention, on random packed trees."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from semrl.rollout.tree import ChainTree
from semrl.update.packing import pack_trees
from semrl.update.tree_attention import blockwise_tree_attention, flex_tree_attention
from tests.helpers import random_chain_tree


def _random_batch(seed: int, groups: int, g: int, max_len: int, prompt_len: int, row_tokens: int | None):
    gen = torch.Generator().manual_seed(seed)
    prompts, chains, trees = [], [], []
    for b in range(groups):
        prompts.append(torch.randint(0, 50, (prompt_len + b,), generator=gen).tolist())
        responses, tree = random_chain_tree(gen, g, 50, max_len)
        chains.append(responses)
        trees.append(tree)
    prompts.append([1, 2])  # a chain ending at once, and a chain that branches at token 0
    chains.append([[3], [3, 4, 5]])
    trees.append(ChainTree((-1, 0), (-1, 0), (1, 3)))
    prompts.append([6, 7, 8])  # a group of one chain
    chains.append([[9, 10, 11, 12]])
    trees.append(ChainTree((-1,), (-1,), (4,)))
    return pack_trees(prompts, chains, trees, pad_token_id=0, row_tokens=row_tokens), prompts, chains, trees


def _reference_visibility(prompts, chains, trees) -> list[torch.Tensor]:
    """Per tree, (T, T) visibility from each chain's path of columns: a token sees the tokens
    before it on any chain that passes through it (written from the layout's definition)."""
    out = []
    for prompt, responses, tree in zip(prompts, chains, trees, strict=True):
        paths: list[list[int]] = []
        n = len(prompt)
        for c, response in enumerate(responses):
            parent, k = tree.parents[c], tree.branch_positions[c]
            inherited = paths[parent][: len(prompt) + k] if parent >= 0 else list(range(len(prompt)))
            own = list(range(n, n + len(response) - (len(inherited) - len(prompt))))
            n += len(own)
            paths.append(inherited + own)
        seen = torch.zeros(n, n, dtype=torch.bool)
        seen[: len(prompt), : len(prompt)] = torch.ones(len(prompt), len(prompt)).tril().bool()
        for path in paths:
            for i, column in enumerate(path):
                seen[column, path[: i + 1]] = True
        out.append(seen)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_layout_visibility_is_each_chain_s_own_prefix(seed):
    batch, prompts, chains, trees = _random_batch(seed, 4, 7, 12, 3, row_tokens=1)  # a tree per row
    dense = batch.layout.dense_visible()
    for row, want in enumerate(_reference_visibility(prompts, chains, trees)):
        t = want.shape[0]
        assert torch.equal(dense[row, :t, :t], want)
        assert not dense[row, :t, t:].any()  # no real token sees padding
        pads = dense.shape[-1] - t  # padding sees earlier padding only
        assert (
            torch.equal(dense[row, t:, t:], torch.ones(pads, pads).tril().bool())
            and not dense[row, t:, :t].any()
        )


def _qkv(batch, heads: int, kv_heads: int, dim: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    b, s = batch.input_ids.shape
    return [
        torch.randn(b, h, s, dim, generator=gen, dtype=torch.float64, requires_grad=True)
        for h in (heads, kv_heads, kv_heads)
    ]


def _dense_reference(q, k, v, batch, scale):
    mask = batch.layout.dense_visible()[:, None]
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
    )
    return out.transpose(1, 2)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("block", [1, 5, 16, 4096])
def test_blockwise_attention_and_gradients_equal_dense(seed, block):
    row_tokens = [None, 1, 10_000][seed % 3]  # default fill (padding left), a tree per row, all in one row
    batch, *_ = _random_batch(seed, 3, 6, 9, 4, row_tokens)
    q, k, v = _qkv(batch, 4, [1, 2, 4][seed % 3], 8, seed)
    want = _dense_reference(q, k, v, batch, 0.3)
    upstream = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    upstream[~batch.real] = 0  # padding's outputs are never used
    got = blockwise_tree_attention(q, k, v, batch.layout, scaling=0.3, block=block)
    real = batch.real
    torch.testing.assert_close(got[real], want[real], atol=1e-12, rtol=1e-10)
    grads = torch.autograd.grad((got * upstream).sum(), (q, k, v))
    want_grads = torch.autograd.grad((want * upstream).sum(), (q, k, v))
    for a, b in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    with torch.no_grad():  # the path without recomputation (old-policy and reference passes)
        torch.testing.assert_close(
            blockwise_tree_attention(q, k, v, batch.layout, 0.3, block=block)[real],
            want[real],
            atol=1e-12,
            rtol=1e-10,
        )


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_block_mask_equals_dense(seed):
    """The CUDA path's BlockMask and mask_mod, run by FlexAttention's CPU forward (it has no CPU
    backward); trees wider than a 128-token block, so partial and fully visible blocks both occur."""
    batch, *_ = _random_batch(seed, 3, 8, 70, 150, [None, 1, 10_000][seed])
    q, k, v = (t.detach().float() for t in _qkv(batch, 4, 2, 16, seed))
    want = _dense_reference(q, k, v, batch, None)
    block_mask = batch.layout.block_mask()
    # the block flags: a tile is computed iff some pair in it is visible, without mask_mod iff all are
    dense, n = batch.layout.dense_visible(), block_mask.kv_num_blocks.shape[-1]
    for row in range(dense.shape[0]):
        for qb in range(n):
            tiles = [dense[row, qb * 128 : (qb + 1) * 128, kb * 128 : (kb + 1) * 128] for kb in range(n)]
            full = {kb for kb, t in enumerate(tiles) if t.shape == (128, 128) and t.all()}
            partial = {kb for kb, t in enumerate(tiles) if t.any()} - full
            got_partial = block_mask.kv_indices[row, 0, qb, : block_mask.kv_num_blocks[row, 0, qb]].tolist()
            got_full = block_mask.full_kv_indices[
                row, 0, qb, : block_mask.full_kv_num_blocks[row, 0, qb]
            ].tolist()
            assert (set(got_partial), set(got_full)) == (partial, full)
    assert int(block_mask.full_kv_num_blocks.sum()) > 0
    with torch.no_grad():
        got = flex_tree_attention(q, k, v, batch.layout)
    torch.testing.assert_close(got[batch.real], want[batch.real], atol=2e-5, rtol=1e-4)


def test_structure_memory_is_linear_in_tokens():
    """The layout at twice the tokens holds about twice the bytes, and far less than the S^2 mask."""
    sizes = []
    for g in (8, 16):
        batch, *_ = _random_batch(0, 1, g, 200, 100, None)
        sizes.append((batch.input_ids.numel(), batch.layout.structure_bytes()))
    (s1, b1), (s2, b2) = sizes
    assert b2 / b1 < 3 * s2 / s1
    assert b2 < s2 * s2 / 8
