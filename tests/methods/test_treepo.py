"""TreePO: the tree advantage and whitening against a reference written from the official code
(multimodal-art-projection/TreePO f055523) on random trees, rivals' hand-computed checks, the
branching budget, the fallback, the repetition test, the scheduler's invariants over random stop
patterns, and the rollout on a real model."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
import torch

from semrl.methods.treepo.advantages import branch_budget, has_repetition, tree_outcome_advantages, whiten
from semrl.methods.treepo.rollout import (
    PromptTree,
    SegmentTreeSettings,
    fallback_paths,
    segments,
    stop_reason,
)
from semrl.rollout.engines import Generation
from semrl.rollout.tree_kit import Node, PromptNodes, chain_tree
from tests.helpers import rollout_context

# ------------------------------------------------------------------------------------------------
# References written from the official code's logic (core_algos.py, torch_functional.py, the rollout)


def _reference_advantage(scores, uids, remove_no_std_subgroup, weight):
    """``compute_tree_reinforce_plus_plus_baseline_outcome_advantage`` before whitening: uids are
    "prompt#node#node..." strings, levels grouped by their first depth + 1 parts."""
    bsz = len(uids)
    per_leaf = {i: [] for i in range(bsz)}
    max_depth = max(len(u.split("#")) - 1 for u in uids)
    for depth in range(max_depth):
        by_id = defaultdict(list)
        keys = ["#".join(u.split("#")[: depth + 1]) for u in uids]
        for i in range(bsz):
            by_id[keys[i]].append(scores[i])
        mean, std = {}, {}
        for k, v in by_id.items():
            t = torch.tensor(v, dtype=torch.float64)
            mean[k], std[k] = (t.mean(), t.std()) if len(v) > 1 else (torch.tensor(0.0), torch.tensor(0.0))
        for i in range(bsz):
            centred = scores[i] - mean[keys[i]]
            size = len(by_id[keys[i]])
            if size > 1 and depth > 0:
                if not (remove_no_std_subgroup and std[keys[i]] == 0.0):
                    per_leaf[i].append((centred, size))
            elif depth == 0:
                per_leaf[i].append((centred, size))
    out = []
    for i in range(bsz):
        if weight == "group_size":
            total = sum(s for _, s in per_leaf[i])
            out.append(sum(float(c) * s / total for c, s in per_leaf[i]))
        else:
            out.append(sum(float(c) for c, _ in per_leaf[i]) / len(per_leaf[i]))
    return torch.tensor(out, dtype=torch.float64)


def _reference_whiten(values, mask):
    """verl's ``masked_whiten`` (shift_mean=True): masked mean, unbiased masked variance, eps 1e-8."""
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / mask.sum() * mask.sum() / (mask.sum() - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8) * mask


def _reference_budget(width, finished, finished_now, active, branch):
    remaining_width_budget = max(width - finished, 0)
    total_divergence = min(remaining_width_budget, finished_now * branch + branch * active)
    total_divergence = max(total_divergence, active)
    average, remainder = total_divergence // active, total_divergence % active
    out = []
    for path_idx in range(active):
        n = average + remainder if path_idx + 1 == active else average
        out.append(max(1, n))
    return out


def _reference_repetition(s, rep_length_thresh=32, rep_count_thresh=8):
    if not s or len(s) < rep_length_thresh:
        return False
    count = {}
    for i in range(len(s) - rep_length_thresh + 1):
        sub = s[i : i + rep_length_thresh]
        count[sub] = count.get(sub, 0) + 1
        if count[sub] >= rep_count_thresh:
            return True
    return False


# ------------------------------------------------------------------------------------------------
# The advantage: rivals.md's hand-computed trees T1-T3


def _paths(spec: list[str]) -> list[tuple[int, ...]]:
    """'a/a1' -> node ids, one id per distinct prefix."""
    ids: dict[str, int] = {}
    out = []
    for leaf in spec:
        parts = leaf.split("/")
        out.append(tuple(ids.setdefault("/".join(parts[: j + 1]), len(ids)) for j in range(len(parts))))
    return out


@pytest.mark.parametrize(
    ("leaves", "rewards", "average", "size", "whitened"),
    [
        (
            ["a/a1", "a/a2", "b/b1", "b/b2"],
            [1, -1, -1, -1],
            [1.25, -0.75, -0.25, -0.25],
            [4 / 3, -2 / 3, -1 / 3, -1 / 3],
            [1.4434, -0.8660, -0.2887, -0.2887],
        ),
        (
            ["a/a1", "a/a2", "b"],
            [1, 1, -1],
            [1 / 3, 1 / 3, -4 / 3],
            [0.4, 0.4, -4 / 3],
            [0.5774, 0.5774, -1.1547],
        ),
        (
            ["a/a'/x", "a/a'/y", "b"],
            [1, -1, -1],
            [10 / 9, -8 / 9, -2 / 3],
            [1.1429, -0.8571, -0.6667],
            [1.1488, -0.6757, -0.4730],
        ),
    ],
)
def test_hand_computed_trees(leaves, rewards, average, size, whitened):
    paths, r = _paths(leaves), torch.tensor(rewards, dtype=torch.float32)
    groups = [0] * len(leaves)
    avg = tree_outcome_advantages(r, groups, paths, "average")
    torch.testing.assert_close(avg, torch.tensor(average), atol=1e-4, rtol=0)
    torch.testing.assert_close(
        tree_outcome_advantages(r, groups, paths, "group_size"), torch.tensor(size), atol=1e-4, rtol=0
    )
    one_token = torch.ones(len(leaves), 1)
    torch.testing.assert_close(
        whiten(avg[:, None], one_token)[:, 0], torch.tensor(whitened), atol=1e-4, rtol=0
    )


def test_whitening_is_token_weighted():
    avg = tree_outcome_advantages(
        torch.tensor([1.0, -1, -1, -1]), [0] * 4, _paths(["a/a1", "a/a2", "b/b1", "b/b2"])
    )
    mask = torch.zeros(4, 4)
    for i, n in enumerate([2, 1, 1, 4]):
        mask[i, :n] = 1
    out = whiten(avg[:, None] * mask, mask)
    torch.testing.assert_close(
        out[:, 0], torch.tensor([1.5771, -1.0791, -0.4150, -0.4150]), atol=1e-4, rtol=0
    )
    assert bool((out[mask == 0] == 0).all())


def _random_batch(rng: random.Random):
    """Random trees over 1-4 prompts: leaves from random branching, with the degenerate cases."""
    kind = rng.choice(["random", "random", "random", "one_leaf", "depth_one", "equal", "chain"])
    paths, groups = [], []
    for p in range(rng.randint(1, 4)):
        node = 0
        if kind == "one_leaf":
            leaves = [(0,)]
        elif kind == "depth_one":
            leaves = [(i,) for i in range(rng.randint(1, 6))]
        elif kind == "chain":  # a single path with a fork at the bottom: repeated levels
            depth = rng.randint(1, 5)
            leaves = [(*range(depth), 100 + i) for i in range(rng.randint(1, 3))]
        else:
            leaves, frontier = [], [()]
            while frontier and len(leaves) < 12:
                prefix = frontier.pop(rng.randrange(len(frontier)))
                for _ in range(rng.randint(1, 3)):
                    child = (*prefix, node)
                    node += 1
                    (leaves if rng.random() < 0.4 or len(child) >= 5 else frontier).append(child)
            leaves += [(*f, 1000 + i) for i, f in enumerate(frontier)]
        paths += leaves
        groups += [p] * len(leaves)
    rewards = [rng.choice([-1.0, 1.0, 0.0, 0.5]) for _ in paths]
    if kind == "equal":
        rewards = [1.0] * len(paths)
    return paths, groups, rewards


@pytest.mark.parametrize("weight", ["average", "group_size"])
@pytest.mark.parametrize("drop", [False, True])
def test_advantage_matches_the_official_estimator_on_random_trees(weight, drop):
    rng = random.Random(1)
    for _ in range(400):
        paths, groups, rewards = _random_batch(rng)
        uids = ["#".join([f"p{g}", *(str(n) for n in path)]) for path, g in zip(paths, groups, strict=True)]
        ref = _reference_advantage(rewards, uids, drop, weight)
        got = tree_outcome_advantages(torch.tensor(rewards), groups, paths, weight, drop)
        torch.testing.assert_close(got.double(), ref, atol=1e-6, rtol=0)
        lengths = [rng.randint(1, 6) for _ in paths]
        mask = torch.zeros(len(paths), 6)
        for i, n in enumerate(lengths):
            mask[i, :n] = 1
        if mask.sum() > 1:
            torch.testing.assert_close(
                whiten(got[:, None] * mask, mask),
                _reference_whiten(ref.float()[:, None] * mask, mask),
                atol=2e-5,
                rtol=1e-5,
            )


def test_subtract_batch_mean_false_divides_only():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        values, mask = torch.randn(5, 4, generator=gen), (torch.rand(5, 4, generator=gen) < 0.7).float()
        mask[0, 0] = mask[1, 0] = 1
        mean = (values * mask).sum() / mask.sum()
        var = (((values - mean) ** 2) * mask).sum() / (mask.sum() - 1)
        torch.testing.assert_close(
            whiten(values * mask, mask, subtract_mean=False), values * mask * torch.rsqrt(var + 1e-8)
        )


# ------------------------------------------------------------------------------------------------
# Budget, fallback, repetition, stop reasons


def test_budget_hand_checks_and_reference():
    assert branch_budget(16, 1, 1, 3, 2) == [2, 2, 4]  # rivals T4
    assert branch_budget(16, 13, 1, 2, 2) == [1, 2]
    assert branch_budget(16, 0, 0, 2, 2) == [2, 2]
    rng = random.Random(0)
    for _ in range(2000):
        w, b = rng.randint(2, 20), rng.randint(1, 4)
        active = rng.randint(1, w)
        finished = rng.randint(0, w - active)
        now = rng.randint(0, finished)
        got = branch_budget(w, finished, now, active, b)
        assert got == _reference_budget(w, finished, now, active, b)
        assert sum(got) + finished <= w  # the invariant that makes every prompt end with w leaves


def test_repetition_hand_checks_and_reference():
    assert not has_repetition("x" * 38) and has_repetition("x" * 39) and has_repetition("ab" * 200)
    rng = random.Random(0)
    for _ in range(500):
        text = "".join(rng.choice("ab ") for _ in range(rng.randint(0, 120)))
        window, count = rng.randint(1, 8), rng.randint(1, 10)
        assert has_repetition(text, window, count) == _reference_repetition(text, window, count)


def _gen(n: int, finished: bool = False) -> Generation:
    return Generation(
        token_ids=torch.arange(n),
        logprobs=torch.zeros(n),
        top_logprobs=torch.zeros(n, 0),
        top_ids=torch.zeros(n, 0, dtype=torch.long),
        entropy=torch.zeros(n),
        finished=finished,
    )


def test_stop_reasons_in_the_code_order():
    s = SegmentTreeSettings(
        width=4, segment_length=4, max_depth=3, branch=2, repetition_window=2, repetition_count=3
    )
    assert stop_reason(_gen(4, True), "so \\boxed{3}", 8, 2, 64, s) == "finished"
    assert stop_reason(_gen(1, True), "", 5, 2, 64, s) == "eos"  # EOS as the segment's only token counts
    assert stop_reason(_gen(4), "\\boxed{3}", 8, 2, 64, s) is None  # boxed without EOS goes on (code)
    assert (
        stop_reason(_gen(4), "\\boxed{3}", 8, 2, 64, SegmentTreeSettings(4, 4, 3, 2, stop_on_boxed=True))
        == "finished"
    )
    assert stop_reason(_gen(4), "ababab", 64, 3, 64, s) == "max_length"
    assert stop_reason(_gen(4), "ababab", 12, 3, 64, s) == "max_depth"
    assert stop_reason(_gen(4), "ababab", 12, 2, 64, s) == "repetition"
    assert stop_reason(_gen(4), "abcdef", 12, 2, 64, s) is None


def _path(
    nodes: PromptNodes, lengths: list[int], reason: str, shared: int = 0, of: Node | None = None
) -> Node:
    """A leaf of ``nodes``'s tree: its first ``shared`` segments those of leaf ``of``, then new
    segments of ``lengths[shared:]`` tokens; ``reason`` why it stopped."""
    parent = segments(of)[shared - 1] if shared else None
    for n in lengths[shared:]:
        parent = nodes.add(len(nodes.nodes), parent, out=_gen(n))
    assert parent is not None
    parent.data = reason
    return parent


def test_fallback_cuts_at_segment_boundaries_and_spends_the_budget():
    gen = torch.Generator().manual_seed(0)
    nodes = PromptNodes(0, [1], None)
    eos = _path(nodes, [4, 4, 2], "eos")
    leaves = [eos, _path(nodes, [4, 4, 4], "max_length", shared=2, of=eos), _path(nodes, [3], "finished")]
    kept = defaultdict(int)
    for _ in range(600):
        starts = fallback_paths(leaves, 3, 2, gen)
        assert len(starts) == 3  # min(b, remaining) copies per candidate until 3 are made
        for start in starts:
            # a segment boundary of a candidate (answer or EOS): one of its segments, or the prompt
            chain = segments(start)
            assert any(segments(leaf)[: len(chain)] == chain for leaf in leaves if leaf.data != "max_length")
            assert start not in leaves  # a cut keeps at most a leaf's segments but its last
            kept[len(chain)] += 1
        assert starts[0] is starts[1]  # the two copies of the first candidate
    assert set(kept) == {0, 1, 2}  # every boundary of the 3-segment leaf, 0 = from the prompt
    only_truncated = [_path(PromptNodes(0, [1], None), [4, 4], "max_length")]
    starts = fallback_paths(only_truncated, 5, 2, gen)
    assert starts == [None, None]  # no answer or EOS leaf: regrow from the prompt, b copies


class _Lockstep:
    """The trees of a batch of prompts grown one depth of every prompt at a time (a ``PromptTree``
    per prompt, all drawing from ``generator``): the policy alone, without an engine; the test gives
    each node its tokens."""

    def __init__(self, num_prompts, settings, max_length, generator):  # noqa: ANN001
        self.trees = [
            PromptTree(PromptNodes(p, [1], None), settings, max_length, generator) for p in range(num_prompts)
        ]

    @property
    def done(self):  # noqa: ANN201
        return all(tree.done for tree in self.trees)

    def active(self, prompt: int):  # noqa: ANN201
        """What each of the prompt's active paths continues (a node, or None: the prompt)."""
        return self.trees[prompt].active

    @property
    def leaves(self):  # noqa: ANN201
        return [tree.leaves for tree in self.trees]

    def grow_and_sample(self, rng: random.Random, p_stop: float) -> None:
        """Every prompt's next depth at once, each node given random tokens within its budget (a
        random stop, EOS, boxed answer or repetition)."""
        for tree in self.trees:
            if tree.done:
                continue
            texts = []
            for node in tree.grow():
                n = rng.randint(1, node.budget) if rng.random() < p_stop else node.budget
                node.out = _gen(n, n < node.budget or rng.random() < p_stop / 3)
                texts.append(rng.choice(["", "", "\\boxed{1}", "aaaaaaaaaa"]))
            tree.advance(texts)


@pytest.mark.parametrize("seed", range(6))
def test_every_prompt_ends_with_width_leaves_under_random_stops(seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(50):
        w, b, seg, d = rng.randint(2, 12), rng.randint(1, 3), rng.randint(1, 5), rng.randint(1, 6)
        b = min(b, w)
        settings = SegmentTreeSettings(
            w,
            seg,
            d,
            b,
            first_branch_max=rng.choice([0, b + 2]),
            repetition_window=4,
            repetition_count=3,
            stop_on_boxed=rng.random() < 0.5,
        )
        max_length = seg * d + rng.randint(-seg + 1, seg) if d > 1 else seg
        prompts = rng.randint(1, 4)
        tree = _Lockstep(prompts, settings, max(1, max_length), gen)
        for p in range(prompts):
            first = len(tree.active(p))
            assert first == min(b, w) if not settings.first_branch_max else b <= first <= min(b + 2, w)
        p_stop = rng.random()
        steps = 0
        while not tree.done:
            before = {p: len(tree.active(p)) for p in range(prompts)}
            leaves_before = [len(x) for x in tree.leaves]
            tree.grow_and_sample(rng, p_stop)
            steps += 1
            assert steps < 1000
            for p in range(prompts):
                finished = len(tree.leaves[p])
                active = tree.active(p)
                assert finished + len(active) <= w
                survivors = before[p] - (finished - leaves_before[p])
                if survivors:  # budget transfer: the survivors' copies are the reference budget
                    per_parent = defaultdict(int)
                    for a in active:
                        per_parent[a.index] += 1
                    want = _reference_budget(w, finished, finished - leaves_before[p], survivors, b)
                    assert list(per_parent.values()) == want
                elif finished < w:  # fallback: only a prompt with no survivor, never more than w
                    assert 1 <= len(active) <= w - finished
        for p in range(prompts):
            leaves = tree.leaves[p]
            assert len(leaves) == w
            for leaf in leaves:
                chain = segments(leaf)
                assert 1 <= len(chain) <= d and len(leaf.response().token_ids) <= max(1, max_length)
                # every segment but the last is a whole segment: cuts and shared prefixes are aligned
                assert all(len(s.out.token_ids) == seg for s in chain[:-1])
                assert [s.position for s in chain] == [seg * i for i in range(len(chain))]
            assert len(set(map(id, leaves))) == w


def test_the_kits_leaf_tree_shares_exactly_the_common_segments():
    """TreePO's leaves as kit nodes (a segment continues its path's last one): the kit's tree of the
    leaves shares exactly the tokens of their common segments, and each leaf's parent is the earliest
    leaf sharing the most."""
    rng = random.Random(0)
    for _ in range(300):
        paths, groups, _ = _random_batch(rng)
        paths = [path for path, g in zip(paths, groups, strict=True) if g == 0][:8]
        nodes = PromptNodes(0, [1], None)
        made: dict[tuple[int, ...], Node] = {}
        leaves = []
        for path in paths:
            parent = None
            for j in range(len(path)):
                if path[: j + 1] not in made:
                    made[path[: j + 1]] = nodes.add(len(nodes.nodes), parent, out=_gen(rng.randint(1, 3)))
                parent = made[path[: j + 1]]
            assert parent is not None
            leaves.append(parent)
        tree = chain_tree(leaves)

        def shared(a: int, c: int, paths=paths, made=made, leaves=leaves) -> int:  # noqa: ANN001
            n = 0
            while n < min(len(paths[a]), len(paths[c])) and paths[a][n] == paths[c][n]:
                n += 1
            own = made[paths[a][:n]].response() if n else None
            return len(leaves[a].response().token_ids) if a == c else (len(own.token_ids) if own else 0)

        for a in range(len(leaves)):
            for c in range(len(leaves)):
                assert tree.shared_prefix(a, c) == shared(a, c)
            best = max(range(a), key=lambda e: (shared(a, e), -e), default=-1)
            expected = best if best >= 0 and shared(a, best) > 0 else -1
            assert tree.parents[a] == expected


# ------------------------------------------------------------------------------------------------
# The rollout on the tiny model (hf engine)


@pytest.fixture(scope="module")
def hf_setup(tiny_model_dir):
    from semrl.models.loading import load_model, load_tokenizer
    from semrl.rollout.engines.hf import HFEngine

    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    engine = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, batch_size=16)
    prompts = [tok(f"Question {i}: go on")["input_ids"] for i in range(3)]
    return engine, tok, prompts


@pytest.mark.parametrize("reuse_kv_cache", [True, False])
def test_rollout_on_a_real_model(hf_setup, reuse_kv_cache):
    """Width leaves per prompt; leaves that share node ids share those tokens; every request held its
    path's tokens and at most a segment's budget; shared segments are sampled once."""
    from semrl.methods.treepo.rollout import segment_tree_rollout
    from semrl.rollout.engines import SamplingParams, join_generations

    engine, tok, prompts = hf_setup
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    settings = SegmentTreeSettings(
        width=6, segment_length=3, max_depth=4, branch=2, reuse_kv_cache=reuse_kv_cache
    )
    requests, original = [], engine.generate

    def spy(reqs, *args, **kwargs):
        requests.extend(reqs)
        return original(reqs, *args, **kwargs)

    engine.generate = spy
    try:
        before = engine.generated_tokens
        out = segment_tree_rollout(
            rollout_context(engine, params, decode=tok.decode, seed=0), prompts, settings
        )
    finally:
        engine.generate = original
    assert [len(leaves) for leaves in out.leaves] == [6, 6, 6]
    assert all(r.max_new_tokens <= 3 and len(r.prefix_ids) % 3 == 0 for r in requests)
    total = 0
    for leaves, responses, tree in zip(out.leaves, out.responses, out.trees, strict=True):
        tokens = [r.token_ids.tolist() for r in responses]
        chains = [segments(leaf) for leaf in leaves]
        assert tokens == [join_generations([s.out for s in chain]).token_ids.tolist() for chain in chains]
        total += sum(len(t) for t in tokens)
        for a in range(6):
            for c in range(6):
                n = 0
                while n < min(len(chains[a]), len(chains[c])) and chains[a][n] is chains[c][n]:
                    n += 1
                assert tokens[a][: 3 * n] == tokens[c][: 3 * n]
            assert len(tokens[a]) <= 12 and all(s.out.cache is None and s.kv is None for s in chains[a])
        assert tree.lengths == tuple(len(t) for t in tokens)
    assert engine.generated_tokens - before < total  # the shared segments were sampled once


def test_a_depths_nodes_let_go_of_their_kv_once_their_children_have_it(hf_setup, monkeypatch):
    """A node's KV is kept for its children only: whenever a callback returns, the sampled nodes of a
    prompt that still hold KV are all of its current depth, and none is a leaf (the engine made no
    copy for a request with ``keep_kv=False``); on vllm, holds of finished depths and leaves would
    take the KV cache's hold budget and leave later children unforked (docs/benchmarks.md)."""
    import semrl.methods.treepo.rollout as treepo_rollout
    from semrl.rollout.engines import SamplingParams
    from semrl.rollout.tree_kit import TreeSampler

    engine, tok, prompts = hf_setup
    depths_held: list[set[int]] = []
    leaves_held: list[int] = []
    leaves_done: set[int] = set()

    def depth(node):  # noqa: ANN001, ANN202
        return 0 if node.parent is None else 1 + depth(node.parent)

    class Watched(TreeSampler):
        def _release_closed(self) -> None:
            super()._release_closed()
            for tree in self.trees:
                held = [n for n in tree.nodes.values() if n.done and n.kv is not None]
                depths_held.append({depth(n) for n in held})
                leaves_held.append(sum(n.leaf for n in tree.nodes.values() if n.done and n.kv is not None))
                leaves_done.update(id(n) for n in tree.nodes.values() if n.done and n.leaf)

    monkeypatch.setattr(treepo_rollout, "TreeSampler", Watched)
    settings = SegmentTreeSettings(width=6, segment_length=2, max_depth=5, branch=2, reuse_kv_cache=True)
    out = treepo_rollout.segment_tree_rollout(
        rollout_context(
            engine, SamplingParams(temperature=1.0, max_new_tokens=10), decode=tok.decode, seed=0
        ),
        prompts,
        settings,
    )
    assert [len(leaves) for leaves in out.leaves] == [6, 6, 6]
    assert max(len(d) for d in depths_held) == 1 and any(depths_held)  # KV held, one depth at a time
    assert not any(leaves_held) and leaves_done  # leaves were sampled, and none kept a copy of its KV


def test_treepo_config_errors_name_the_key():
    from semrl.config.load import load_config
    from semrl.errors import ConfigError

    base = ["algorithm.method=treepo", "rollout.max_new_tokens=64"]
    for overrides, key in [
        (["treepo.segment_length=24"], "treepo.segment_length"),  # does not divide 64
        ([], "treepo.segment_length"),  # the paper's 512 exceeds a 64-token budget
        (["treepo.segment_length=16", "treepo.branch=0"], "treepo.branch"),
        (["treepo.segment_length=16", "treepo.branch=9"], "treepo.branch"),
        (["treepo.segment_length=16", "rollout.group_size=1"], "rollout.group_size"),
        (["treepo.segment_length=16", "treepo.first_branch_max=1"], "treepo.first_branch_max"),
    ]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, [*base, *overrides])
    cfg = load_config(None, [*base, "treepo.segment_length=24", "treepo.max_depth=3"])
    assert cfg.algorithm.loss_agg_mode == "token-mean" and cfg.algorithm.clip_ratio_high == 0.28


@pytest.mark.parametrize("block", [1, 4, 8])
def test_block_alignment_takes_the_engines_kv_block_size(hf_setup, block, monkeypatch):
    """``treepo.segment_alignment=block`` aligns segments to the KV block of the engine it samples
    with (``EnginePowers.kv_block_size``), not to a vllm option: each prompt's first segment asks for
    ``segment_length - (P - 1) mod B`` tokens, and hf's own block (1) is the paper's layout."""
    from dataclasses import replace

    from semrl.methods.registry import load
    from tests.helpers import tree_method_context

    engine, tok, _ = hf_setup
    prompts = [list(range(5, 5 + length)) for length in (5, 6, 7)]  # lengths that differ modulo B
    assert engine.powers.kv_block_size == 1
    monkeypatch.setattr(engine, "powers", replace(engine.powers, kv_block_size=block))
    seen: list = []
    original = engine.generate_dynamic

    def spy(requests, params, generator, on_done, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        def recorded(tag, request, generation):  # noqa: ANN001, ANN202
            more = on_done(tag, request, generation)
            seen.extend(r for _, r in more)
            return more

        seen.extend(r for _, r in requests)
        return original(requests, params, generator, recorded, *args, **kwargs)

    monkeypatch.setattr(engine, "generate_dynamic", spy)
    extra = ["treepo.segment_length=8", "treepo.segment_alignment=block", "rollout.vllm_block_size=32"]
    spec, ctx = tree_method_context(engine, tok, engine.model, "treepo", extra)
    load(spec.rollout_fn)(ctx, prompts)
    firsts = {tuple(r.prompt_ids): r.max_new_tokens for r in seen if not r.prefix_ids}
    assert firsts == {tuple(p): 8 - (len(p) - 1) % block for p in prompts}
    assert block == 1 or len(set(firsts.values())) > 1  # the prompts' lengths differ modulo the block


def test_block_alignment_is_checked_against_the_vllm_block_only_on_vllm():
    from semrl.config.load import load_config
    from semrl.errors import ConfigError

    base = ["algorithm.method=treepo", "rollout.max_new_tokens=64", "treepo.segment_alignment=block"]
    with pytest.raises(ConfigError, match=r"multiple of\s+rollout\.vllm_block_size \(32\)"):
        load_config(None, [*base, "treepo.segment_length=16", "rollout.engine=vllm"])
    assert load_config(None, [*base, "treepo.segment_length=16"]).rollout.engine == "hf"
