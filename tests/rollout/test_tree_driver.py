"""What a rollout costs on each engine, and the event-driven tree driver (docs/engines.md, "What a
rollout costs" and "Tree rollouts on the engines"): hand-counted engine costs, tree tokens that do not
depend on the batch limit, block-aligned TreePO branches that recompute one token, no barrier across
prompts, and the driver's trees equal to lockstep ones."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from semrl.methods.treepo.advantages import tree_outcome_advantages
from semrl.methods.treepo.rollout import (
    PromptTree,
    SegmentTreeSettings,
    first_segment_length,
    segment_tree_rollout,
    segments,
)
from semrl.models.loading import load_model, load_tokenizer
from semrl.rollout.engines import (
    EngineCost,
    Generation,
    GenerationRequest,
    SamplingParams,
    build_engine,
)
from semrl.rollout.seeds import node_seed, prompt_generator
from semrl.rollout.tree_kit import Node, PromptNodes
from semrl.tracking.metrics import cost_metrics
from tests.helpers import eager_vllm, rollout_context, vllm_batch_limit, vllm_or_skip

MAX_MODEL_LEN = 512  # the session's vLLM engine (tests/rollout/test_engines.py starts it with this length)
BLOCK = 32  # the vllm engine's default block size


@pytest.fixture(scope="module")
def setup(digit32_model_dir):
    return load_tokenizer(str(digit32_model_dir)), load_model(str(digit32_model_dir))


def _engine(kind, model, tok, fork=True):
    if kind == "vllm":
        vllm_or_skip()
    options = replace(eager_vllm(), vllm_fork=fork)
    engine = build_engine(kind, model, tok, 64, MAX_MODEL_LEN, logprobs_top_k=20, vllm_options=options)
    engine.sync_weights()  # an empty prefix cache: nothing from other tests serves these prompts
    return engine


def _prompts(tok, n, words=12):
    # over one KV block, unequal lengths so that the aligned first segments differ
    return [tok(f"Case {i} of the driver: " + "go on " * (words + 3 * i))["input_ids"] for i in range(n)]


def _leaf_tokens(out):
    return [[leaf.response().token_ids.tolist() for leaf in leaves] for leaves in out.leaves]


# ------------------------------------------------------------------------------------------------
# Engine cost


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_engine_cost_equals_a_hand_count(setup, kind):
    """Two requests in one call, then a branch of the first: sampled and prefill tokens, forward
    passes and the running batch, counted by hand from the lengths; the sampled tokens per prompt."""
    from collections import Counter

    tok, model = setup
    engine = _engine(kind, model, tok)
    prompts = _prompts(tok, 2)
    params = SamplingParams(temperature=1.0, max_new_tokens=9, logprobs_top_k=0)
    engine.request_log = []
    engine.sampled_by_prompt = Counter()
    before = engine.cost.snapshot()
    gens = engine.generate(
        [GenerationRequest(prompts[0], seed=1), GenerationRequest(prompts[1], max_new_tokens=4, seed=2)],
        params,
        reuse_kv_cache=True,
    )
    spent = engine.cost.since(before)
    n = [len(g.token_ids) for g in gens]
    assert spent.sampled_tokens == sum(n) and spent.requests == 2
    assert spent.prefill_tokens == len(prompts[0]) + len(prompts[1])  # nothing cached yet
    # both rows start in the first forward; each runs in one forward per token it samples
    assert spent.engine_steps == max(n) and spent.running_rows == sum(n)
    assert [r.prefill_tokens for r in engine.request_log] == [len(p) for p in prompts]
    # a branch of the first response at its k-th token
    k = n[0] - 1
    context = len(prompts[0]) + k
    before = engine.cost.snapshot()
    (branch,) = engine.generate(
        [
            GenerationRequest(
                prompts[0],
                gens[0].token_ids[:k].tolist(),
                max_new_tokens=3,
                cache=gens[0].cache,
                seed=3,
            )
        ],
        params,
    )
    spent = engine.cost.since(before)
    assert engine.sampled_by_prompt == {
        tuple(prompts[0]): n[0] + len(branch.token_ids),
        tuple(prompts[1]): n[1],
    }
    engine.sampled_by_prompt = None
    # hf: the parent's KV serves all but the last context token; vllm: whole blocks, the rest again
    assert spent.prefill_tokens == (1 if kind == "hf" else (context - 1) % BLOCK + 1)
    assert spent.engine_steps == spent.sampled_tokens and spent.mean_running_batch == 1.0
    assert engine.request_log[-1].prefill_tokens == spent.prefill_tokens
    engine.request_log = None


def test_cost_metrics_of_a_step():
    cost = EngineCost(
        sampled_tokens=120, prefill_tokens=40, engine_steps=10, running_rows=35, requests=6, sampling_s=1.5
    )
    metrics = cost_metrics(cost, trajectories=8, seconds=2.0, total=lambda x: 2.0 * x)  # two equal processes
    assert metrics == {
        "rollout/sampled_tokens": 240.0,
        "rollout/prefill_tokens": 80.0,
        "rollout/engine_steps": 10.0,
        "rollout/running_batch": 3.5,
        "time/rollout_tokens_per_s": 120.0,
        "time/rollout_trajectories_per_s": 8.0,
        "time/rollout/sampling_s": 1.5,  # this process's seconds in the engine
        "time/rollout/around_s": 0.5,
    }
    assert EngineCost(1, 2, 3, 4, 5).since(EngineCost(1, 1, 1, 1, 1)) == EngineCost(0, 1, 2, 3, 4)


# ------------------------------------------------------------------------------------------------
# The driver on vllm


def test_tree_tokens_do_not_depend_on_thevllm_batch_limit(setup):
    """The same prompt seeds at running batches of 64 and 3 give the same trees, although the requests
    finish in another order."""
    vllm_or_skip()
    tok, model = setup
    engine = _engine("vllm", model, tok)
    prompts = _prompts(tok, 4)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, logprobs_top_k=0)
    settings = SegmentTreeSettings(width=6, segment_length=4, max_depth=3, branch=2)
    runs, orders = [], []
    for limit in (64, 3):
        engine.request_log = []
        with vllm_batch_limit(engine, limit):
            runs.append(
                segment_tree_rollout(
                    rollout_context(engine, params, decode=tok.decode, prompt_seeds=[7, 8, 9, 10]),
                    prompts,
                    settings,
                )
            )
        orders.append([r.tag for r in engine.request_log])
    engine.request_log = None
    assert orders[0] != orders[1]  # the schedule changed
    assert _leaf_tokens(runs[0]) == _leaf_tokens(runs[1])
    paths = [[[[s.index for s in segments(leaf)] for leaf in ls] for ls in run.leaves] for run in runs]
    assert paths[0] == paths[1]


def test_a_prompt_branches_while_another_prompts_first_segment_runs(setup):
    """No barrier across prompts: with room for two sequences, prompt 0's second depth is submitted
    before the other prompts' first segments come back."""
    vllm_or_skip()
    tok, model = setup
    engine = _engine("vllm", model, tok)
    prompts = _prompts(tok, 4)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, logprobs_top_k=0)
    settings = SegmentTreeSettings(width=4, segment_length=4, max_depth=3, branch=2)
    engine.request_log = []
    with vllm_batch_limit(engine, 2):
        segment_tree_rollout(
            rollout_context(engine, params, decode=tok.decode, prompt_seeds=[1, 2, 3, 4]), prompts, settings
        )
    log, engine.request_log = engine.request_log, None
    first = {p: [r for r in log if r.tag[0] == p and r.context_tokens == len(prompts[p])] for p in range(4)}
    children = [r for r in log if r.tag[0] == 0 and r.context_tokens > len(prompts[0])]
    assert children
    assert min(r.submitted_step for r in children) < max(r.finished_step for r in first[3])


@pytest.mark.parametrize(("aligned", "fork"), [(True, False), (False, False), (False, True)])
def test_aligned_treepo_branches_recompute_one_context_token(setup, aligned, fork):
    """With block-aligned segments every branch (a request with a prefix) computes exactly one context
    token, read from vLLM's num_cached_tokens; the paper's layout recomputes more with vLLM's prefix
    cache alone, and one token with the fork (docs/engines.md, "Forks on vllm")."""
    vllm_or_skip()
    tok, model = setup
    engine = _engine("vllm", model, tok, fork=fork)
    prompts = _prompts(tok, 4)
    assert len({len(p) % BLOCK for p in prompts}) > 1
    params = SamplingParams(temperature=1.0, max_new_tokens=96, logprobs_top_k=0)
    settings = SegmentTreeSettings(
        width=6,
        segment_length=BLOCK,
        max_depth=3,
        branch=2,
        block_size=BLOCK if aligned else 0,
    )
    engine.request_log = []
    out = segment_tree_rollout(
        rollout_context(engine, params, decode=tok.decode, prompt_seeds=[5, 6, 7, 8]), prompts, settings
    )
    log, engine.request_log = engine.request_log, None
    branches = [r for r in log if r.context_tokens > len(prompts[r.tag[0]])]
    assert len(branches) >= 8
    if aligned:
        assert all(r.prefill_tokens == 1 for r in branches), [r.prefill_tokens for r in branches]
        for p, leaves in enumerate(out.leaves):  # d segments still cover the response budget
            first = first_segment_length(settings, len(prompts[p]))
            assert all(len(segments(leaf)[0].out.token_ids) <= first for leaf in leaves)
    elif fork:
        assert all(r.prefill_tokens == 1 for r in branches), [r.prefill_tokens for r in branches]
    else:
        assert max(r.prefill_tokens for r in branches) > 1


# ------------------------------------------------------------------------------------------------
# The driver against lockstep trees


def _lockstep(engine, prompts, params, settings, decode, seeds):
    """Today's lockstep schedule: every prompt's depth in one engine call, the same node seeds."""
    trees = [
        PromptTree(
            PromptNodes(p, prompts[p], seeds[p]),
            settings,
            params.max_new_tokens,
            prompt_generator(seeds[p]),
            first_segment_length(settings, len(prompts[p])),
        )
        for p in range(len(prompts))
    ]
    while not all(t.done for t in trees):
        live = [t for t in trees if not t.done]
        nodes = [node for t in live for node in t.grow()]
        requests = [
            GenerationRequest(
                prompts[node.prompt],
                node.prefix_ids(),
                max_new_tokens=node.budget,
                seed=node_seed(seeds[node.prompt], node.index),
            )
            for node in nodes
        ]
        for node, out in zip(nodes, engine.generate(requests, params), strict=True):
            node.out = out
        for t in live:
            t.advance([decode(node.out.token_ids.tolist()) for node in t.sampling])
    return [t.leaves for t in trees]


@pytest.mark.parametrize("block", [0, 8])
def test_the_driver_grows_the_trees_of_lockstep_sampling(setup, block):
    """hf engine: the driver's leaves (tokens, node paths, stop reasons) equal those of a lockstep loop
    with the same seeds, and so do TreePO's advantages on them."""
    tok, model = setup
    engine = _engine("hf", model, tok)
    prompts = _prompts(tok, 3, words=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, logprobs_top_k=0)
    settings = SegmentTreeSettings(
        width=6,
        segment_length=8 if block else 4,
        max_depth=2 if block else 4,
        branch=2,
        first_branch_max=3,
        block_size=block,
        reuse_kv_cache=False,
    )
    seeds = [11, 12, 13]
    driven = segment_tree_rollout(
        rollout_context(engine, params, decode=tok.decode, prompt_seeds=seeds), prompts, settings
    ).leaves
    stepped = _lockstep(engine, prompts, params, settings, tok.decode, seeds)

    def described(leaf: Node) -> tuple[list[int], list[int], str]:
        return leaf.response().token_ids.tolist(), [s.index for s in segments(leaf)], leaf.data

    for a, b in zip(driven, stepped, strict=True):
        assert [described(x) for x in a] == [described(x) for x in b]
    rewards = torch.rand(18, generator=torch.Generator().manual_seed(0)).round()
    groups = [p for p in range(3) for _ in range(6)]
    paths = [[described(x)[1] for leaves in trees for x in leaves] for trees in (driven, stepped)]
    torch.testing.assert_close(
        tree_outcome_advantages(rewards, groups, paths[0], "average", False),
        tree_outcome_advantages(rewards, groups, paths[1], "average", False),
    )


# ------------------------------------------------------------------------------------------------
# Aligned budgets (no model)


def _segment(n: int) -> Generation:
    return Generation(
        token_ids=torch.zeros(n, dtype=torch.long),
        logprobs=torch.zeros(n),
        top_logprobs=torch.zeros(n, 0),
        top_ids=torch.zeros(n, 0, dtype=torch.long),
        entropy=None,
        finished=False,
    )


@pytest.mark.parametrize("seed", range(4))
def test_aligned_boundaries_leave_every_branch_context_at_one_past_a_block(seed):
    """Random prompt lengths, block sizes and depths: every segment boundary of every path puts the
    context at 1 (mod B), and a path that never stops early still spans min(d x l, budget) tokens."""
    rng = random.Random(seed)
    for _ in range(200):
        block = rng.choice([1, 2, 16, 32])
        length, depth = block * rng.randint(1, 4), rng.randint(1, 5)
        prompt = rng.randint(1, 100)
        budget = length * depth if rng.random() < 0.7 else rng.randint(1, length * depth)
        settings = SegmentTreeSettings(
            width=4, segment_length=length, max_depth=depth, branch=2, block_size=block
        )
        tree = PromptTree(
            PromptNodes(0, [1], None),
            settings,
            budget,
            torch.Generator().manual_seed(0),
            first_segment_length(settings, prompt),
        )
        while not tree.done:
            for node in tree.grow():
                node.out = _segment(node.budget)
            tree.advance([""] * len(tree.sampling))
        for leaf in tree.leaves:
            assert len(leaf.response().token_ids) == min(length * depth, budget)
            position = prompt
            for segment in segments(leaf)[:-1]:
                position += len(segment.out.token_ids)
                assert position % block == 1 % block


@pytest.mark.parametrize("method", ["fr3e", "rose"])
def test_fr3e_and_rose_samples_do_not_depend_on_thevllm_batch_limit(setup, method):
    """FR3E's continuations and ROSE's branches join the running batch as their parents finish; with
    the trainer's prompt seeds their samples are the same at running batches of 64 and 1."""
    vllm_or_skip()
    from functools import partial

    from semrl.config.load import load_config
    from semrl.methods.catalog import get_method
    from semrl.methods.interface import RolloutContext
    from semrl.methods.registry import load, method_config
    from semrl.rollout.engines import sampling_params
    from semrl.update.row_logprobs import with_sampling_entropy

    tok, model = setup
    engine = _engine("vllm", model, tok)
    cfg = load_config(
        None, [f"algorithm.method={method}", "rollout.max_new_tokens=40", "rollout.group_size=4"]
    )
    spec = get_method(method)
    params = sampling_params(cfg.rollout, top_logprobs=spec.reads_top_logprobs)
    entropy = partial(
        with_sampling_entropy, model, temperature=params.temperature, compute_dtype=engine.compute_dtype
    )
    from semrl.data import build_prompt_ids
    from tests.helpers import DIGIT_SYSTEM_PROMPT

    # two prompts that run to the budget, then two the digit model answers in two tokens: at a batch
    # of 64 the short ones come back first, one at a time they come back in order
    short = [build_prompt_ids(tok, f"Pick a number ({i}).", DIGIT_SYSTEM_PROMPT) for i in range(2)]
    prompts = [*_prompts(tok, 2), *short]
    runs, orders = [], []
    for limit in (64, 1):
        ctx = RolloutContext(
            engine,
            params,
            torch.Generator().manual_seed(0),
            method_config(cfg, spec.section),
            entropy,
            decode=partial(tok.decode, skip_special_tokens=True),
            prompt_seeds=[21, 22, 23, 24],
        )
        engine.request_log = []
        with vllm_batch_limit(engine, limit):
            runs.append([g.token_ids.tolist() for g in load(spec.rollout_fn)(ctx, prompts).generations])
        orders.append([r.tag for r in engine.request_log])
    engine.request_log = None
    assert [str(t) for t in orders[0]] != [str(t) for t in orders[1]]
    assert runs[0] == runs[1]
