"""The vllm engine's fork (``semrl.rollout.engines.vllm.fork``; docs/engines.md, "Forks on vllm"): a
child continues its finished parent's KV inside vLLM, partial block included, computing one context
token, with the tokens and log-probs of a plain child; every hold is let go; a child whose context
is not its parent's takes the plain path; on a vLLM the hooks were not written for nothing forks."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from semrl.methods.catalog import tree_methods
from semrl.methods.registry import load
from semrl.models.loading import load_model, load_tokenizer
from semrl.rollout.engines import Generation, GenerationRequest, SamplingParams, build_engine
from semrl.rollout.engines.vllm.drive import EngineCall
from semrl.rollout.engines.vllm.fork import HeldKV
from semrl.rollout.tree_kit import Node, TreeSampler
from tests.helpers import eager_vllm, tiny_vllm_engine, tree_method_context, vllm_or_skip

MAX_MODEL_LEN = 512  # the session's vLLM engine (tests/rollout/test_engines.py starts it with this length)
BLOCK = 32


@pytest.fixture(scope="module")
def setup(tiny32_model_dir):
    vllm_or_skip()
    return load_tokenizer(str(tiny32_model_dir)), load_model(str(tiny32_model_dir))


def _engine(model, tok, fork=True):
    return tiny_vllm_engine(model, tok, vllm_fork=fork)


def _prompt(tok, length):
    ids = tok("Fork case: " + "and so on " * 40)["input_ids"]
    return ids[:length]


def _children(engine, prompt, positions, params, reuse_kv_cache, seeds=(3, 4, 5)):
    """A parent of 60 tokens, then one child per (position, seed) that continues it at that position;
    returns the children and the engine's request log."""
    kit = TreeSampler(engine, [prompt], params, None, [7], reuse_kv_cache=reuse_kv_cache)
    children: list[Node] = []

    def on_node(node: Node) -> list[Node]:
        if node.index:
            return []
        children.extend(
            kit.trees[0].add(1 + i * len(seeds) + s, node, k, budget=6)
            for i, k in enumerate(positions)
            for s in range(len(seeds))
        )
        return list(children)

    engine.request_log = []
    try:
        kit.run([kit.trees[0].add(0, budget=60)], on_node)
    finally:
        log, engine.request_log = engine.request_log, None
    assert kit.held() == 0
    return children, {record.tag: record for record in log}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_forks_compute_one_context_token_and_equal_a_plain_child(setup, temperature):
    tok, model = setup
    params = SamplingParams(temperature=temperature, max_new_tokens=80, logprobs_top_k=2)
    prompt = _prompt(tok, 21)
    # contexts of L tokens with L mod 32 in 0, 1, 3, 26, 31 (the parent's response is 60 tokens)
    positions = [
        (target - len(prompt)) % BLOCK + (BLOCK if target < len(prompt) else 0)
        for target in (0, 1, 3, 26, 31)
    ]
    positions = [k if k <= 60 else k - BLOCK for k in positions]
    assert sorted((len(prompt) + k) % BLOCK for k in positions) == [0, 1, 3, 26, 31]
    forking = _engine(model, tok)
    assert forking.powers.fork
    before = forking.cost.snapshot()
    forked, forked_log = _children(forking, prompt, positions, params, reuse_kv_cache=True)
    spent = forking.cost.since(before)
    plain_engine = _engine(model, tok, fork=False)
    assert not plain_engine.powers.fork
    plain, plain_log = _children(plain_engine, prompt, positions, params, reuse_kv_cache=True)
    # a context of L = 1 (mod 32) tokens is served whole by the prefix cache: nothing to fork
    partial_hits = [c for c in forked if (len(prompt) + c.position - 1) % BLOCK]
    assert spent.forked_requests == len(partial_hits) > 0 and spent.fork_fallbacks == 0
    for a, b in zip(forked, plain, strict=True):
        assert a.out is not None and b.out is not None
        assert a.out.token_ids.tolist() == b.out.token_ids.tolist()
        assert torch.equal(a.out.logprobs, b.out.logprobs)  # the same to the last digit
        length = len(prompt) + a.position
        assert forked_log[(0, a.index)].prefill_tokens == 1
        assert plain_log[(0, b.index)].prefill_tokens == (length - 1) % BLOCK + 1
    if temperature > 0:  # seeded siblings continue one context and differ from each other
        by_position: dict[int, list[list[int]]] = {}
        for child in forked:
            assert child.out is not None
            by_position.setdefault(child.position, []).append(child.out.token_ids.tolist())
        assert all(len({tuple(t) for t in siblings}) > 1 for siblings in by_position.values())


def test_a_child_that_does_not_continue_its_parent_takes_the_plain_path(setup):
    """Before forking, the child's context is checked against the parent's computed tokens: a child
    naming a parent it does not continue computes its context, samples what a plain request samples,
    and is counted as a fallback."""
    tok, model = setup
    engine = _engine(model, tok)
    prompt = _prompt(tok, 40)
    params = SamplingParams(temperature=1.0, max_new_tokens=40, logprobs_top_k=2)
    held: list[HeldKV] = []
    outs: dict[str, Generation] = {}

    def on_done(tag, request, out):  # noqa: ANN001, ANN202
        outs[tag] = out
        if tag != "parent":
            return []
        assert isinstance(out.cache, HeldKV)
        held.append(out.cache)
        wrong = [*prompt[:-1], prompt[-1] + 1, *out.token_ids[:5].tolist()]  # one token differs
        return [
            ("wrong", GenerationRequest(wrong, max_new_tokens=6, cache=out.cache, seed=9)),
            ("plain", GenerationRequest(wrong, max_new_tokens=6, seed=9)),
        ]

    before = engine.cost.snapshot()
    engine.generate_dynamic(
        [("parent", GenerationRequest(prompt, max_new_tokens=20, seed=1))], params, None, on_done, True
    )
    spent = engine.cost.since(before)
    assert held and spent.fork_fallbacks == 1 and spent.forked_requests == 0
    assert outs["wrong"].token_ids.tolist() == outs["plain"].token_ids.tolist()
    assert engine.llm.reset_prefix_cache()


EXTRA = {
    "treepo": ["treepo.segment_length=6"],
    "latr": ["latr.lookahead=[2]", "latr.tau_abs=0.0", "latr.tau_rel=1.0", "latr.eta_values=[0.5]"],
    "fr3e": ["fr3e.num_anchors=2"],
}


@pytest.mark.parametrize("method", tree_methods())
def test_every_tree_method_forks_the_same_tokens_and_holds_nothing_after(setup, method):
    """Each tree method on vllm with the fork gives the tokens it gives without it; afterwards no
    block is held, and the weight push's prefix-cache reset succeeds."""
    tok, model = setup
    prompts = [_prompt(tok, n) for n in (17, 30, 45)]
    runs = []
    for fork in (True, False):
        engine = _engine(model, tok, fork=fork)
        spec, ctx = tree_method_context(engine, tok, model, method, EXTRA.get(method, []))
        before = engine.cost.snapshot()
        out = load(spec.rollout_fn)(ctx, prompts)
        runs.append(([g.token_ids.tolist() for g in out.generations], engine.cost.since(before)))
        forks = getattr(engine, "forks", None)
        assert forks is None or (not forks.held and not forks.parents)
        assert engine.llm.reset_prefix_cache()
    (forked, cost), (plain, plain_cost) = runs
    assert forked == plain
    assert cost.forked_requests > 0 and cost.prefill_tokens < plain_cost.prefill_tokens


def test_latrs_rows_that_sample_to_their_end_hold_no_kv(setup, monkeypatch):
    """LATR's streamed lookahead rows are the only parents: its ordinary rows and the requests that
    finish a kept row are leaves (``keep_kv=False``), so at 32 prompts their holds no longer take the
    budget from the streams (docs/engines.md, "Forks on vllm")."""
    tok, model = setup
    engine = _engine(model, tok)
    spec, ctx = tree_method_context(engine, tok, model, "latr", EXTRA["latr"])
    submitted: list[GenerationRequest] = []
    prepare = EngineCall._prepare

    def watched(call, request, *args):  # noqa: ANN001, ANN202
        submitted.append(request)
        return prepare(call, request, *args)

    monkeypatch.setattr(EngineCall, "_prepare", watched)
    load(spec.rollout_fn)(ctx, [_prompt(tok, n) for n in (17, 30, 45)])
    streams = [r for r in submitted if r.stream]
    rows = [r for r in submitted if not r.stream]
    assert streams and all(r.keep_kv for r in streams)
    assert rows and not any(r.keep_kv for r in rows)
    assert any(r.prefix_ids for r in rows)  # finishing requests of kept rows were among them


def test_on_a_vllm_the_fork_was_not_written_for_nothing_forks_and_it_says_so_once(setup, monkeypatch, caplog):
    from semrl.rollout.engines.vllm import fork as vllm_fork
    from semrl.rollout.engines.vllm import state as vllm_state

    tok, model = setup
    monkeypatch.setattr(vllm_fork, "SUPPORTED", ("0.99.",))
    monkeypatch.setattr(vllm_state, "NOTICES_SAID", set())
    with caplog.at_level(logging.WARNING, logger="semrl.rollout.engines.vllm.fork"):
        engines = [_engine(model, tok), _engine(model, tok)]
    said = [r for r in caplog.records if "rollout.vllm_fork" in r.getMessage()]
    assert len(said) == 1 and "0.99." in said[0].getMessage()
    assert not any(e.powers.fork for e in engines)
    spec, ctx = tree_method_context(engines[0], tok, model, "treepo", EXTRA["treepo"])
    prompts = [_prompt(tok, n) for n in (17, 30, 45)]
    before = engines[0].cost.snapshot()
    gated = [g.token_ids.tolist() for g in load(spec.rollout_fn)(ctx, prompts).generations]
    assert engines[0].cost.since(before).forked_requests == 0
    monkeypatch.undo()
    forking = _engine(model, tok)
    spec, ctx = tree_method_context(forking, tok, model, "treepo", EXTRA["treepo"])
    assert forking.powers.fork
    before = forking.cost.snapshot()
    assert gated == [g.token_ids.tolist() for g in load(spec.rollout_fn)(ctx, prompts).generations]
    assert forking.cost.since(before).forked_requests > 0


def test_holds_never_starve_the_engine(setup, monkeypatch):
    """Holds keep blocks out of the KV cache. Allowed all of a small cache, they fill it with finished
    leaves until the waiting children cannot start; the engine then lets go of them (the children
    take the plain path) instead of stepping forever. Within ``HELD_SHARE`` they never do."""
    from semrl.rollout.engines.vllm import fork as vllm_fork
    from semrl.rollout.engines.vllm.drive import scheduler_of

    tok, model = setup
    options = replace(eager_vllm(), vllm_kv_cache_gib=0.004)  # about 130 blocks of 32 tokens
    engine = build_engine("vllm", model, tok, 16, MAX_MODEL_LEN, logprobs_top_k=20, vllm_options=options)
    core = engine.llm.llm_engine
    scheduler, step, idle = scheduler_of(core), core.step, [0]
    pool = scheduler.kv_cache_manager.block_pool.num_gpu_blocks
    assert pool < 300

    def watched():  # noqa: ANN202
        out = step()
        idle[0] = 0 if out else idle[0] + 1
        if idle[0] > 200:
            raise RuntimeError(f"the engine stalled: {len(scheduler.waiting)} requests wait, none runs")
        return out

    monkeypatch.setattr(core, "step", watched)
    prompts = [_prompt(tok, 40 + 3 * i) for i in range(16)]
    params = SamplingParams(temperature=1.0, max_new_tokens=60, logprobs_top_k=0)
    for share, starved in ((1.0, True), (vllm_fork.HELD_SHARE, False)):
        monkeypatch.setattr(vllm_fork, "HELD_SHARE", share)
        kit = TreeSampler(engine, prompts, params, None, list(range(16)), reuse_kv_cache=True)
        held: list[int] = []

        def on_node(node: Node, kit=kit, held=held) -> list[Node]:  # noqa: ANN001
            held.append(len({id(b) for h in engine.forks.held.values() for b in h.blocks}))
            if node.index:
                return []
            return [kit.trees[node.prompt].add(1 + i, node, 0, budget=60) for i in range(8)]

        before = engine.cost.snapshot()
        kit.run([tree.add(0, budget=1) for tree in kit.trees], on_node)
        spent = engine.cost.since(before)
        assert all(n.done for tree in kit.trees for n in tree.nodes.values())
        assert spent.forked_requests > 0 and max(held) <= share * pool
        assert (spent.fork_fallbacks > 0) == starved
    assert engine.llm.reset_prefix_cache()


def test_a_leaf_holds_nothing_and_a_full_hold_budget_is_counted_and_said_once(setup, monkeypatch, caplog):
    """A node the method marks as a leaf (``Node.leaf``) is never held: its children-to-be do not exist,
    and its blocks would take the hold budget. A parent that finds the budget full is not held: its
    children take the plain path, ``holds_refused`` counts it and the engine says so once."""
    from semrl.rollout.engines.vllm import fork as vllm_fork
    from semrl.rollout.engines.vllm import state as vllm_state

    tok, model = setup
    engine = _engine(model, tok)
    params = SamplingParams(temperature=1.0, max_new_tokens=20, logprobs_top_k=0)
    prompts = [_prompt(tok, 30 + 5 * i) for i in range(3)]
    kit = TreeSampler(engine, prompts, params, None, [1, 2, 3], reuse_kv_cache=True)
    held_when_back: list[int] = []

    def on_node(node: Node) -> list[Node]:
        held_when_back.append(len(engine.forks.held))
        return [] if node.index else [kit.trees[node.prompt].add(1, node, 5, leaf=True)]

    before = engine.cost.snapshot()
    kit.run([tree.add(0) for tree in kit.trees], on_node)
    spent = engine.cost.since(before)
    assert spent.forked_requests == 3 and spent.holds_refused == 0
    leaves = [tree.nodes[1] for tree in kit.trees]
    assert all(leaf.kv is None for leaf in leaves) and max(held_when_back) <= 3  # the 3 roots at most
    monkeypatch.setattr(vllm_fork, "HELD_SHARE", 0.0)
    monkeypatch.setattr(vllm_state, "NOTICES_SAID", set())
    with caplog.at_level(logging.WARNING, logger="semrl.rollout.engines.vllm.fork"):
        for _ in range(2):
            kit = TreeSampler(engine, prompts, params, None, [1, 2, 3], reuse_kv_cache=True)
            before = engine.cost.snapshot()
            kit.run([tree.add(0) for tree in kit.trees], on_node)
            spent = engine.cost.since(before)
            assert spent.holds_refused == 3 and spent.forked_requests == 0
    said = [r.getMessage() for r in caplog.records if "holds reached" in r.getMessage()]
    assert len(said) == 1 and "rollout.vllm_kv_cache_gib" in said[0]
    assert engine.llm.reset_prefix_cache()


def test_a_closed_prompt_lets_go_of_its_holds_at_once_and_a_waiting_child_still_forks(setup, monkeypatch):
    """Each prompt's root gets three children and is closed in the same callback (as ROSE and TreePO
    close a tree that will grow no further): the kit lets go of the root at once. On a running batch
    of two, the children wait for admission, so vLLM keeps the let-go root until they are admitted
    (every child forks, none falls back), and frees it then, not at the call's end: a let-go root is
    never held past the first step after its children are admitted."""
    from tests.helpers import vllm_batch_limit

    tok, model = setup
    engine = _engine(model, tok)
    params = SamplingParams(temperature=1.0, max_new_tokens=20, logprobs_top_k=0)
    prompts = [_prompt(tok, 30 + 7 * i) for i in range(3)]
    kit = TreeSampler(engine, prompts, params, None, [1, 2, 3], reuse_kv_cache=True)
    let_go: list[str] = []
    release = engine.release_kv

    def recorded(kv):  # noqa: ANN001
        let_go.append(kv.request_id)
        release(kv)

    monkeypatch.setattr(engine, "release_kv", recorded)
    still_held: list[set[str]] = []  # let go by the kit, and held by vLLM for no waiting child
    engine_held: list[int] = []

    def on_node(node: Node) -> list[Node]:
        forks = engine.forks
        still_held.append(set(let_go) & set(forks.held) - forks.deferred)
        engine_held.append(len(forks.held))
        if node.index:
            return []
        kit.close(node.prompt)
        return [kit.trees[node.prompt].add(1 + k, node, 4 + 3 * k, budget=6) for k in range(3)]

    before = engine.cost.snapshot()
    with vllm_batch_limit(engine, 2):
        kit.run([tree.add(0, budget=20) for tree in kit.trees], on_node)
    spent = engine.cost.since(before)
    assert spent.forked_requests == 9 and spent.fork_fallbacks == 0  # no child lost its parent
    assert max(engine_held) > 0 and len(let_go) >= 3  # roots were held for their children, then let go
    assert all(not ids for ids in still_held), still_held
    assert not engine.forks.held and not engine.forks.deferred  # no stale let-go ids after the call
