"""ROSE tree rollout on the tiny model."""

import pytest
import torch

from semrl.algos.branching import branch_scores, normalized_embeddings
from semrl.algos.rose_rollout import tree_rollout
from semrl.config import RoseConfig
from semrl.models import load_model, load_tokenizer
from semrl.rollout import RolloutEngine, SamplingParams


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    engine = RolloutEngine(model, [tok.eos_token_id], tok.pad_token_id, batch_size=16)
    emb = normalized_embeddings(model.get_input_embeddings().weight)
    prompts = [tok(f"Question {i}: go on")["input_ids"] for i in range(3)]
    return engine, emb, prompts


PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12)


def test_epsilon_zero_branches_every_iteration_from_the_argmax(setup):
    engine, emb, prompts = setup
    groups = tree_rollout(engine, prompts, 4, PARAMS, emb, RoseConfig(epsilon=0.0), torch.Generator().manual_seed(0))
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
    groups = tree_rollout(engine, prompts, 4, PARAMS, emb, RoseConfig(epsilon=1.0), torch.Generator().manual_seed(0))
    for g in groups:
        assert g.tree.parents == (-1, -1, -1, -1) and not any(g.branched)
        assert g.generated_tokens == sum(g.tree.lengths)


def test_seeded_tree_rollout_is_repeatable(setup):
    engine, emb, prompts = setup
    a = tree_rollout(engine, prompts, 4, PARAMS, emb, RoseConfig(), torch.Generator().manual_seed(3))
    b = tree_rollout(engine, prompts, 4, PARAMS, emb, RoseConfig(), torch.Generator().manual_seed(3))
    assert [g.tree for g in a] == [g.tree for g in b]
