"""ROSE tree rollout on the tiny model."""

import pytest
import torch

from semrl.methods.rose import RoseConfig
from semrl.methods.rose.branching import branch_scores, normalized_embeddings
from semrl.methods.rose.rollout import tree_rollout
from semrl.models.loading import load_model, load_tokenizer
from semrl.rollout.engines import SamplingParams
from semrl.rollout.engines.hf import HFEngine
from tests.helpers import rollout_context


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    engine = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, batch_size=16)
    emb = normalized_embeddings(model.get_input_embeddings().weight)
    prompts = [tok(f"Question {i}: go on")["input_ids"] for i in range(3)]
    return engine, emb, prompts


PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12)


def test_epsilon_zero_branches_every_iteration_from_the_argmax(setup):
    engine, emb, prompts = setup
    groups = tree_rollout(
        rollout_context(engine, PARAMS, RoseConfig(epsilon=0.0), group_size=4, seed=0),
        prompts,
        emb,
    ).groups
    assert len(groups) == 3
    for g in groups:
        assert len(g.generations) == 4 and g.branched == [False, True, True, True]
        tree = g.tree
        for c in range(1, 4):
            p, k = tree.parents[c], tree.branch_positions[c]
            assert torch.equal(g.generations[c].token_ids[:k], g.generations[p].token_ids[:k])
            assert len(g.generations[c].token_ids) <= PARAMS.max_new_tokens
        # the first branch is at the argmax of the root chain's scores
        root = g.generations[0]
        score, _, _ = branch_scores(root.top_logprobs, root.top_ids, emb)
        assert tree.parents[1] == 0 and tree.branch_positions[1] == int(torch.argmax(score))
        assert g.generated_tokens <= sum(tree.lengths)
        assert len(g.chosen_entropy) == 3


def test_epsilon_one_gives_independent_chains(setup):
    engine, emb, prompts = setup
    groups = tree_rollout(
        rollout_context(engine, PARAMS, RoseConfig(epsilon=1.0), group_size=4, seed=0),
        prompts,
        emb,
    ).groups
    for g in groups:
        assert g.tree.parents == (-1, -1, -1, -1) and not any(g.branched)
        assert g.generated_tokens == sum(g.tree.lengths)


def test_seeded_tree_rollout_is_repeatable(setup):
    engine, emb, prompts = setup
    a = tree_rollout(
        rollout_context(engine, PARAMS, RoseConfig(), group_size=4, seed=3),
        prompts,
        emb,
    ).groups
    b = tree_rollout(
        rollout_context(engine, PARAMS, RoseConfig(), group_size=4, seed=3),
        prompts,
        emb,
    ).groups
    assert [g.tree for g in a] == [g.tree for g in b]


def test_round_schedule_matches_the_sequential_algorithm(setup):
    """Fresh chains first, then one branch per round: every branch picks the argmax over exactly
    the chains with a smaller index, as the sequential loop of section 1.3 would."""
    engine, emb, prompts = setup
    result = tree_rollout(
        rollout_context(engine, PARAMS, RoseConfig(epsilon=0.5), group_size=8, seed=5),
        prompts,
        emb,
    )
    branches_per_prompt = [sum(g.branched) for g in result.groups]
    assert result.rounds == 1 + max(branches_per_prompt)
    assert 0 < result.score_seconds < result.generate_seconds
    for g in result.groups:
        assert g.tree.parents[0] == -1 and len(g.generations) == 8
        for c in range(1, 8):
            parent, k = g.tree.parents[c], g.tree.branch_positions[c]
            if parent < 0:
                assert k == 0
                continue
            assert parent < c
            earlier = [branch_scores(x.top_logprobs, x.top_ids, emb)[0] for x in g.generations[:c]]
            flat = torch.cat(earlier)
            offset = sum(len(x) for x in earlier[:parent])
            assert int(torch.argmax(flat)) == offset + k
            assert g.generations[c].cache is None  # freed once the trees are complete


def test_kv_reuse_does_not_change_greedy_trees(setup):
    """With greedy decoding the tree is deterministic; reusing the parent's cache must not change it."""
    engine, emb, prompts = setup
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    ref = tree_rollout(
        rollout_context(engine, greedy, RoseConfig(epsilon=0.0, reuse_kv_cache=False), group_size=4),
        prompts,
        emb,
    )
    out = tree_rollout(
        rollout_context(engine, greedy, RoseConfig(epsilon=0.0, reuse_kv_cache=True), group_size=4),
        prompts,
        emb,
    )
    for a, b in zip(ref.groups, out.groups, strict=True):
        # A greedy branch often repeats its parent, so two chains can share the prefix a branch
        # starts from; their branch scores then tie up to rounding, which the cache reuse changes.
        # The trees must agree up to that choice: the same branch positions, and parents with the
        # same prefix (so the branch's request, and everything sampled after it, is the same).
        assert a.tree.branch_positions == b.tree.branch_positions
        for c, k in enumerate(a.tree.branch_positions):
            pa, pb = a.tree.parents[c], b.tree.parents[c]
            assert (pa < 0) == (pb < 0)
            if pa >= 0:
                assert torch.equal(a.generations[pa].token_ids[:k], b.generations[pb].token_ids[:k])
        for x, y in zip(a.generations, b.generations, strict=True):
            assert torch.equal(x.token_ids, y.token_ids)
            assert torch.allclose(x.logprobs, y.logprobs, atol=1e-4)


@pytest.mark.parametrize("reuse_kv_cache", [True, False])
def test_every_branch_copies_its_parent_up_to_k_and_resamples_from_k(setup, reuse_kv_cache):
    """For every branched chain of real trees: the request held exactly the parent's first k tokens
    and the budget L - k; the chain equals its parent before k; the token at k was sampled again
    (it differs from the parent's in some chains, which a copy of k + 1 tokens never would)."""
    engine, emb, prompts = setup
    requests = []
    original = engine.generate

    def spy(reqs, *args, **kwargs):
        requests.extend(reqs)
        return original(reqs, *args, **kwargs)

    engine.generate = spy
    try:
        differs, branched = 0, 0
        for seed in range(4):
            requests.clear()
            out = tree_rollout(
                rollout_context(
                    engine,
                    PARAMS,
                    RoseConfig(epsilon=0.3, reuse_kv_cache=reuse_kv_cache),
                    group_size=6,
                    seed=seed,
                ),
                prompts,
                emb,
            )
            for p, group in enumerate(out.groups):
                tree, chains = group.tree, [g.token_ids.tolist() for g in group.generations]
                for c, (parent, k) in enumerate(zip(tree.parents, tree.branch_positions, strict=True)):
                    assert len(chains[c]) <= PARAMS.max_new_tokens
                    if parent < 0:
                        continue
                    branched += 1
                    assert chains[c][:k] == chains[parent][:k]
                    assert len(chains[c]) > k  # at least the re-sampled token
                    differs += chains[c][k] != chains[parent][k]
                    match = [
                        r
                        for r in requests
                        if r.prompt_ids == prompts[p]
                        and r.prefix_ids == chains[parent][:k]
                        and r.max_new_tokens == PARAMS.max_new_tokens - k
                    ]
                    assert match, (
                        f"no request continued chain {parent} from its first {k} tokens with budget L - k"
                    )
                    assert group.generations[c].logprobs.shape == (len(chains[c]),)
        assert branched > 20 and differs > branched // 4, (branched, differs)
    finally:
        engine.generate = original
