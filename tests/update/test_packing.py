"""Tree-packed log-probs, entropies, losses and gradients equal the padded per-chain ones."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from semrl.methods.catalog import tree_methods
from semrl.rollout.sequences import make_sequence_batch
from semrl.rollout.tree import ChainTree
from semrl.update.forward import response_logprobs
from semrl.update.packing import pack_trees, packed_response_logprobs
from tests.helpers import dense_attention_mask, random_chain_tree


def test_pack_layout_on_a_hand_built_tree():
    # prompt [1, 2]; chain 0 = [3, 4, 5]; chain 1 branches at k=1: [3, 6]; chain 2 fresh: [7]
    tree = ChainTree((-1, 0, -1), (-1, 1, 0), (3, 2, 1))
    packed = pack_trees([[1, 2]], [[[3, 4, 5], [3, 6], [7]]], [tree], pad_token_id=0)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 2]]
    assert packed.packed_tokens == 7
    seen = packed.layout.dense_visible()[0]
    assert seen[5].nonzero().flatten().tolist() == [0, 1, 2, 5]  # token 6 sees prompt, the shared 3, itself
    assert seen[6].nonzero().flatten().tolist() == [0, 1, 6]  # the fresh chain sees only the prompt
    assert packed.predictor.tolist() == [[1, 2, 3], [1, 2, -1], [1, -1, -1]]
    assert packed.targets[1, :2].tolist() == [3, 6] and packed.response_mask[2].tolist() == [1, 0, 0]
    mask = dense_attention_mask(packed, torch.float32)
    assert (
        mask.shape == (1, 1, 7, 7)
        and mask[0, 0, 5, 4] == torch.finfo(torch.float32).min
        and mask[0, 0, 5, 2] == 0
    )
    with pytest.raises(ValueError, match="chain 1 does not start"):
        pack_trees([[1, 2]], [[[3, 4, 5], [9, 6], [7]]], [tree], pad_token_id=0)


@pytest.mark.parametrize("row_tokens", [None, 1, 10_000])  # default fill, one tree per row, all in one row
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("query_block", [7, 256])  # many query blocks per tree, one block per row
def test_packed_equals_padded_on_random_trees(tiny_model_dir, attn, row_tokens, query_block, monkeypatch):
    monkeypatch.setattr("semrl.update.tree_attention.CPU_QUERY_BLOCK", query_block)
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, attn_implementation=attn, dtype=torch.float32
    )
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts, groups, trees = [], [], []
    for b in range(3):
        prompts.append(torch.randint(0, vocab, (5 + 3 * b,), generator=gen).tolist())
        responses, tree = random_chain_tree(gen, 6, vocab, 9)
        groups.append(responses)
        trees.append(tree)
    # a tree without branches: independent samples of unequal lengths
    prompts.append([11, 12, 13])
    groups.append([[5] * n for n in (1, 7, 3)])
    trees.append(ChainTree((-1, -1, -1), (-1, 0, 0), (1, 7, 3)))

    packed = pack_trees(prompts, groups, trees, pad_token_id=0, row_tokens=row_tokens)
    assert (
        packed.input_ids.shape[0] == {None: packed.input_ids.shape[0], 1: len(groups), 10_000: 1}[row_tokens]
    )
    assert packed.packed_tokens == sum(  # each tree's prompt once, each chain's tokens after its branch point
        len(p) + sum(len(r) - (t.branch_positions[c] if t.parents[c] >= 0 else 0) for c, r in enumerate(g))
        for p, g, t in zip(prompts, groups, trees, strict=True)
    )
    padded = make_sequence_batch(
        [p for p, g in zip(prompts, groups, strict=True) for _ in g],
        [r for g in groups for r in g],
        pad_token_id=0,
    )
    assert packed.packed_tokens < padded.attention_mask.sum()
    adv = torch.randn(packed.response_mask.shape, generator=gen)

    def run(fn, batch):
        model.zero_grad()
        logp, entropy = fn(model, batch, temperature=0.7)
        loss = -(logp * adv[:, : logp.shape[1]]).sum() / batch.response_mask.sum()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        return logp.detach(), entropy, loss.detach(), grads

    lp_pack, h_pack, loss_pack, g_pack = run(packed_response_logprobs, packed)
    lp_pad, h_pad, loss_pad, g_pad = run(response_logprobs, padded)
    r = lp_pad.shape[1]
    assert torch.equal(packed.response_mask[:, :r], padded.response_mask)
    torch.testing.assert_close(lp_pack[:, :r], lp_pad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h_pack[:, :r], h_pad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_pack, loss_pad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(g_pack, g_pad, atol=1e-5, rtol=1e-4)


EXTRA = {
    "treepo": ["treepo.segment_length=2"],
    # every token forks until the width is full; windows short enough to prune in 10 tokens
    "latr": [
        "latr.tau_abs=0.0",
        "latr.tau_rel=1.0",
        "latr.lookahead=[2,3]",
        "latr.keep_math_symbols=false",
        "latr.eta_values=[0.5]",
    ],
}


# the baselines, and every registered method that samples its own groups (the catalog's tree methods)
PACKED_METHODS = ["grpo", "dr_grpo", *tree_methods()]


@pytest.mark.parametrize("method", PACKED_METHODS)
def test_training_step_is_the_same_packed_or_padded(tiny_model_dir, tmp_path, method):
    """The packed loss and gradient (each shared prefix once) equal the padded ones (every chain
    carries its own copy of the prefix), on the trees each method's rollout makes."""
    import json

    from semrl.config.load import load_config
    from semrl.runtime.trainer import Trainer

    task = tmp_path / "task.jsonl"
    task.write_text(
        "".join(
            json.dumps({"id": f"t{i}", "problem": f"Say a number ({i}).", "answer": "7"}) + "\n"
            for i in range(16)
        )
    )
    models = {}
    for packing in ("none", "tree"):
        cfg = load_config(
            None,
            [
                f"model.name={tiny_model_dir}",
                f"data.train={task}",
                "data.eval=null",
                f"algorithm.method={method}",
                "rollout.group_size=6",
                "rollout.prompts_per_step=2",
                "rollout.max_new_tokens=10",
                "trainer.micro_batch_size=5",
                "trainer.steps=1",
                "trainer.lr=1e-2",
                "algorithm.kl_coef=0.01",
                f"trainer.packing={packing}",
                f"logging.output_dir={tmp_path / packing}",
                "logging.progress=false",
                "logging.report_to=[]",
                *EXTRA.get(method, []),
            ],
        )
        trainer = Trainer(cfg)
        assert trainer.actor.models.packing == (packing == "tree")
        metrics = trainer.train()
        if method == "treepo":  # the trees shared prefixes, which packing computed once
            assert metrics["treepo/sampled_vs_independent"] < 1
        if method == "latr":
            assert metrics["latr/forks"] > 0
        # after one AdamW step, exp_avg = (1 - beta1) * the accumulated gradient: compare gradients,
        # not weights (Adam turns float noise on near-zero gradients into lr-sized steps)
        grads = [
            trainer.run.optim.optimizer.state[p]["exp_avg"] / 0.1 for p in trainer.models.model.parameters()
        ]
        models[packing] = (grads, metrics)
    (g_pad, m_pad), (g_pack, m_pack) = models["none"], models["tree"]
    assert m_pack["loss"] == pytest.approx(m_pad["loss"], rel=1e-4, abs=1e-6)
    assert m_pack["kl"] == pytest.approx(m_pad["kl"], rel=1e-3, abs=1e-7)
    torch.testing.assert_close(
        torch.cat([g.flatten() for g in g_pack]),
        torch.cat([g.flatten() for g in g_pad]),
        atol=1e-5,
        rtol=1e-4,
    )
