"""The tree-rollout kit (``semrl.rollout.tree_kit``) under random trees on both engines: leaf counts,
prefix sharing, per-node seeds independent of completion order, every node's KV let go (on errors
too), the trees and advantages of the kit equal to an independent bookkeeping, and the engine powers
a method is refused without (docs/engines.md, "What each engine can do")."""

from __future__ import annotations

import random
from dataclasses import replace
from functools import partial

import pytest
import torch

from semrl.config.load import load_config
from semrl.errors import EngineError
from semrl.methods.catalog import get_method
from semrl.methods.interface import RolloutContext
from semrl.methods.registry import load, method_config
from semrl.methods.rose.advantages import segment_advantages
from semrl.models.loading import load_model, load_tokenizer
from semrl.rollout.engines import SamplingParams, build_engine, sampling_params
from semrl.rollout.seeds import node_seed, seeds_or_draw
from semrl.rollout.tree import ChainTree
from semrl.rollout.tree_kit import Node, TreeSampler, chain_tree
from semrl.runtime.setup import check_engine_powers
from tests.helpers import eager_vllm, vllm_batch_limit, vllm_or_skip

MAX_MODEL_LEN = 512  # the session's vLLM engine (tests/rollout/test_engines.py starts it with this length)
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=10, logprobs_top_k=0)
SEEDS = [11, 12, 13]
CASES = 6  # random policies per engine


@pytest.fixture(scope="module")
def setup(digit32_model_dir):
    return load_tokenizer(str(digit32_model_dir)), load_model(str(digit32_model_dir))


def _engine(kind, model, tok):
    if kind == "vllm":
        vllm_or_skip()
    engine = build_engine(kind, model, tok, 64, MAX_MODEL_LEN, logprobs_top_k=20, vllm_options=eager_vllm())
    engine.sync_weights()
    return engine


def _prompts(tok):
    return [tok(f"Tree {i} of the kit: " + "go on " * (3 + 4 * i))["input_ids"] for i in range(len(SEEDS))]


def _policy(kit: TreeSampler, case: int, held: list[int], fail_at: int | None = None):
    """A random tree: each finished node (depth < 3) gets 0-2 children at random positions of its
    response, with random budgets. Every choice and every index follow from the node's (prompt,
    index) alone (child k of node i is node 3i + k + 1), never from completion order."""
    calls = [0]

    def on_node(node: Node) -> list[Node]:
        calls[0] += 1
        if fail_at is not None and calls[0] == fail_at:
            raise RuntimeError("a method's callback failed")
        held.append(kit.held())
        rng = random.Random(f"{case}-{node.prompt}-{node.index}")
        length = len(node.response().token_ids)
        if node.index >= 4:  # depth 2: a leaf
            return []
        return [
            kit.trees[node.prompt].add(
                3 * node.index + k + 1, node, rng.randint(0, length), budget=rng.randint(1, 6)
            )
            for k in range(rng.randint(0, 2))
        ]

    return on_node


def _reference_response(node: Node) -> list[int]:
    """Independent of ``Node.response``: the parent's reference response cut at the position, then the
    node's own tokens."""
    assert node.out is not None
    own = node.out.token_ids.tolist()
    return own if node.parent is None else _reference_response(node.parent)[: node.position] + own


def _origins(node: Node) -> list[tuple[int, int]]:
    """(node index, position) where each response token was sampled."""
    assert node.out is not None
    own = [(node.index, node.position + t) for t in range(len(node.out.token_ids))]
    return own if node.parent is None else _origins(node.parent)[: node.position] + own


def _common(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _grow(engine, prompts, case, limit, kind, fail_at=None, root_budgets=None):
    kit = TreeSampler(engine, prompts, PARAMS, torch.Generator().manual_seed(0), SEEDS, reuse_kv_cache=True)
    held: list[int] = []
    engine.request_log = []
    roots = [
        tree.add(0, budget=b)
        for tree, b in zip(kit.trees, root_budgets or [None] * len(prompts), strict=True)
    ]
    try:
        if kind == "vllm":
            with vllm_batch_limit(engine, limit):
                kit.run(roots, _policy(kit, case, held, fail_at))
        else:
            engine.batch_size, before = limit, engine.batch_size
            try:
                kit.run(roots, _policy(kit, case, held, fail_at))
            finally:
                engine.batch_size = before
    finally:
        log, engine.request_log = engine.request_log, None
    return kit, held, log


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_random_trees_keep_the_kits_invariants(setup, kind):
    tok, model = setup
    engine = _engine(kind, model, tok)
    prompts = _prompts(tok)
    branched = 0
    for case in range(CASES):
        runs = []
        for limit in (64, 2):  # another batch, another completion order
            kit, held, log = _grow(engine, prompts, case, limit, kind)
            assert kit.held() == 0  # every node's KV let go at the end
            # while the trees grew, nodes held their KV for their children (both engines fork)
            assert engine.powers.fork and max(held) > 0
            served = {record.tag: record for record in log}
            tokens = {}
            for p, tree in enumerate(kit.trees):
                nodes = [tree.nodes[i] for i in sorted(tree.nodes)]
                assert len(served) >= len(nodes) and all(n.done for n in nodes)  # a leaf per node
                for node in nodes:
                    response = node.response().token_ids.tolist()
                    assert response == _reference_response(node)
                    if node.parent is not None:  # its prefix is exactly its parent's tokens
                        assert (
                            response[: node.position]
                            == node.parent.response().token_ids.tolist()[: node.position]
                        )
                        branched += 1
                    record = served[(p, node.index)]
                    assert record.context_tokens == len(prompts[p]) + node.position
                    assert record.sampled_tokens == len(node.out.token_ids)
                    tokens[(p, node.index)] = response
                # the kit's trees: shared tokens by construction, the parent each rule names
                origins = [_origins(n) for n in nodes]
                explicit = [-1 if n.parent is None else nodes.index(n.parent) for n in nodes]
                for tree_of in (chain_tree(nodes), chain_tree(nodes, explicit)):
                    for a in range(len(nodes)):
                        for b in range(len(nodes)):
                            assert tree_of.shared_prefix(a, b) == _common(origins[a], origins[b])
                earliest = [
                    max(range(c), key=lambda e, c=c: (_common(origins[c], origins[e]), -e), default=-1)
                    for c in range(len(nodes))
                ]
                assert chain_tree(nodes).parents == tuple(
                    e if e >= 0 and _common(origins[c], origins[e]) > 0 else -1
                    for c, e in enumerate(earliest)
                )
                # ROSE's advantages on the kit's tree equal those on the tree ROSE kept by hand
                by_hand = ChainTree(
                    tuple(explicit),
                    tuple(-1 if i == 0 else (n.position if n.parent else 0) for i, n in enumerate(nodes)),
                    tuple(len(t) for t in (tokens[(p, n.index)] for n in nodes)),
                )
                rewards = torch.tensor([float(len(tokens[(p, n.index)]) % 2) for n in nodes])
                for code_compat in (False, True):
                    assert torch.equal(
                        segment_advantages(chain_tree(nodes, explicit), rewards, 16, code_compat=code_compat),
                        segment_advantages(by_hand, rewards, 16, code_compat=code_compat),
                    )
            runs.append(tokens)
        # per-node seeds: the same trees whatever the batch and the order requests came back in
        assert runs[0] == runs[1]
    assert branched > 20


def test_every_request_draws_from_its_nodes_seed(setup):
    tok, model = setup
    engine = _engine("hf", model, tok)
    kit = TreeSampler(engine, _prompts(tok), PARAMS, None, SEEDS)
    node = kit.trees[1].add(5)
    assert kit.request(node).seed == node_seed(SEEDS[1], 5)
    with pytest.raises(ValueError, match="a node index is its seed"):
        kit.trees[1].add(5)


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_an_error_in_a_callback_lets_go_of_every_nodes_kv(setup, kind):
    tok, model = setup
    engine = _engine(kind, model, tok)
    prompts = _prompts(tok)
    # the first root back fails while the longer ones still run
    with pytest.raises(RuntimeError, match="callback failed"):
        _grow(engine, prompts, 1, 64, kind, fail_at=1, root_budgets=[1, 8, 10])
    if kind == "vllm":  # no request of the failed call is left running in the engine
        assert not engine.llm.llm_engine.has_unfinished_requests()
        assert engine.llm.reset_prefix_cache()
    kit, held, _ = _grow(engine, prompts, 1, 64, kind)  # the next rollout runs
    assert kit.held() == 0 and all(n.done for t in kit.trees for n in t.nodes.values())


def test_the_kv_is_let_go_when_the_call_raises(setup):
    """The failed call's own sampler: nodes that held KV when the callback raised hold none after."""
    tok, model = setup
    engine = _engine("hf", model, tok)
    kit = TreeSampler(engine, _prompts(tok), PARAMS, None, SEEDS, reuse_kv_cache=True)
    seen: list[int] = []

    def on_node(node: Node) -> list[Node]:
        seen.append(kit.held())
        if len(seen) == len(SEEDS):
            raise RuntimeError("a method's callback failed")
        return []

    with pytest.raises(RuntimeError):
        kit.run([tree.add(0) for tree in kit.trees], on_node)
    assert max(seen) > 0 and kit.held() == 0


def _latr_context(engine, tok, cfg):
    return RolloutContext(
        engine,
        sampling_params(cfg.rollout, top_logprobs=False),
        torch.Generator().manual_seed(0),
        method_config(cfg, "latr"),
        lambda *a: None,
        decode=partial(tok.decode, skip_special_tokens=True),
    )


def test_a_method_needing_a_power_its_engine_lacks_is_refused(setup):
    """LATR's official split needs the engine's row loop; an engine that declares none (vllm on a
    sharded model, a plug-in engine) is refused at start-up, naming the engine and the option. The hf
    engine cannot stream."""
    tok, model = setup
    engine = _engine("hf", model, tok)
    cfg = load_config(
        None,
        [
            "algorithm.method=latr",
            "latr.lookahead_on=model",
            "rollout.max_new_tokens=6",
            "latr.lookahead=[2]",
        ],
    )
    check_engine_powers(engine, cfg)  # hf has a row loop
    engine.powers = replace(engine.powers, row_loop=False)
    message = r"the hf engine.*row_loop.*latr\.lookahead_on=model"
    with pytest.raises(EngineError, match=message):
        check_engine_powers(engine, cfg)
    with pytest.raises(EngineError, match=message):
        load(get_method("latr").rollout_fn)(_latr_context(engine, tok, cfg), _prompts(tok))
    stream = load_config(None, ["algorithm.method=latr", "rollout.max_new_tokens=6", "latr.lookahead=[2]"])
    check_engine_powers(engine, stream)  # the default needs no power: hf runs the lookahead on its model
    with pytest.raises(EngineError, match="streaming"):
        engine.generate_streaming([], PARAMS, PARAMS, None, lambda *a: [], lambda p: ([], []))


def test_a_run_on_an_engine_without_a_needed_power_is_refused_at_start_up(
    digit_model_dir, seven_task, tmp_path, monkeypatch
):
    """Through the trainer: the hf engine, with its row loop withheld as vllm's is on a sharded
    model, refuses LATR's latr.lookahead_on=model when the run is built, before its first step, and
    not at its first rollout."""
    from semrl.rollout.engines.hf import HFEngine
    from semrl.runtime.trainer import Trainer
    from tests.helpers import tiny_run_config

    built = HFEngine.__init__

    def without_row_loop(self, *args, **kwargs):
        built(self, *args, **kwargs)
        self.powers = replace(self.powers, row_loop=False)

    monkeypatch.setattr(HFEngine, "__init__", without_row_loop)
    cfg = tiny_run_config(
        digit_model_dir,
        seven_task,
        tmp_path / "run",
        "algorithm.method=latr",
        "latr.lookahead_on=model",
        "latr.lookahead=[2]",
    )
    with pytest.raises(EngineError, match=r"the hf engine.*row_loop.*latr\.lookahead_on=model"):
        Trainer(cfg)  # the run's start-up: models, engine, checks


@pytest.mark.parametrize("seeded", [True, False])
def test_a_sampler_from_a_rollout_context_takes_its_engine_stream_seeds_and_entropy(setup, seeded):
    """``TreeSampler.from_context``: the context's engine, sampler and random stream, its prompts'
    seeds (or as many drawn from its stream, as ``seeds_of_prompts`` draws them), and its entropy."""
    from dataclasses import replace

    from tests.helpers import tree_method_context

    tok, model = setup
    engine = _engine("hf", model, tok)
    _, ctx = tree_method_context(engine, tok, model, "fr3e", [])
    if not seeded:
        ctx = replace(ctx, prompt_seeds=None, generator=torch.Generator().manual_seed(4))
    prompts = _prompts(tok)
    kit = TreeSampler.from_context(ctx, prompts, reuse_kv_cache=True)
    expected = ctx.prompt_seeds or seeds_or_draw(None, len(prompts), torch.Generator().manual_seed(4))
    assert [tree.seed for tree in kit.trees] == expected
    assert (kit.engine, kit.params, kit.generator) == (ctx.engine, ctx.params, ctx.generator)
    assert kit.sampling_entropy is ctx.sampling_entropy and kit.reuse_kv_cache
