"""LATR: rivals.md's hand checks, the window metrics against references written from the official
code (starreeze/latr 2adb0ed), the lookahead forest against a port of the code's loop on random
token streams, the rollout on a real model, and the config's errors."""

from __future__ import annotations

import dataclasses
import random
from functools import cache

import pytest
import torch

from semrl.methods.latr.tree import (
    MATH_SYMBOLS,
    ForestSettings,
    LatrForest,
    PruneRule,
    edit_distance,
    eta_at,
    forks,
    latr_width,
    rouge_l,
    suffix_match,
)
from semrl.methods.registry import load

EOS = 2
# a fork test that about a quarter of the peaked models' positions pass, with short lookaheads
PERMISSIVE_FORKS = (
    "latr.tau_abs=0.02",
    "latr.tau_rel=0.95",
    "latr.lookahead=[2,3]",
    "latr.keep_math_symbols=false",
    "latr.edit_distance_threshold=0.6",
)

# ------------------------------------------------------------------------------------------------
# References from the official code (model/metrics.py, model/sample_filter.py, model/generation.py)


def _ref_edit_distance(a, b):
    @cache
    def d(i, j):
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))

    return d(len(a), len(b))


def _longest_prefix_in_text(pattern, text):
    """The code's KMP scan."""
    m = len(pattern)
    if m == 0:
        return 0
    pi, j = [0] * m, 0
    for i in range(1, m):
        while j > 0 and pattern[i] != pattern[j]:
            j = pi[j - 1]
        if pattern[i] == pattern[j]:
            j += 1
        pi[i] = j
    q = best = 0
    for t in text:
        while q > 0 and pattern[q] != t:
            q = pi[q - 1]
        if pattern[q] == t:
            q += 1
        best = max(best, q)
        if q == m:
            q = pi[q - 1]
    return best


def _ref_suffix_match(a, b):
    ra, rb = a[::-1], b[::-1]
    return max(_longest_prefix_in_text(ra, rb), _longest_prefix_in_text(rb, ra)) / len(a)


def _ref_rouge_l(a, b):
    m, n = len(a), len(b)
    if m > n:
        a, b, m, n = b, a, n, m
    prev, curr = [0] * (m + 1), [0] * (m + 1)
    for i in range(n):
        for j in range(m):
            curr[j + 1] = prev[j] + 1 if b[i] == a[j] else max(prev[j + 1], curr[j])
        prev, curr = curr, prev
    lcs = prev[m]
    prec, rec = lcs / len(a), lcs / len(b)
    return 0.0 if prec + rec == 0 else 2 * prec * rec / (prec + rec)


def test_hand_checks():
    """rivals.md 3.5."""
    assert not forks(0.5, 0.3, 0.25, 0.15) and forks(0.5, 0.3, 0.15, 0.25) and forks(0.45, 0.35, 0.25, 0.15)
    a = [1, 2, 3, 4, 5]
    assert edit_distance(a, [1, 2, 3, 4, 6]) / 5 == pytest.approx(0.2)
    assert suffix_match(a, [1, 2, 3, 4, 6]) == 0.0 and rouge_l(a, [1, 2, 3, 4, 6]) == pytest.approx(0.8)
    assert edit_distance(a, [6, 7, 8, 4, 5]) / 5 == pytest.approx(0.6)
    assert suffix_match(a, [6, 7, 8, 4, 5]) == pytest.approx(0.4) and rouge_l(
        a, [6, 7, 8, 4, 5]
    ) == pytest.approx(0.4)
    assert edit_distance(a, [5, 1, 2, 3, 9]) / 5 == pytest.approx(0.6)
    assert suffix_match(a, [5, 1, 2, 3, 9]) == pytest.approx(0.2) and rouge_l(
        a, [5, 1, 2, 3, 9]
    ) == pytest.approx(0.6)
    math_rule = PruneRule(edit_distance=None, suffix_match=0.2, rouge_l=0.5)
    assert PruneRule(edit_distance=0.4).too_similar(a, [1, 2, 3, 4, 6])
    assert math_rule.too_similar(a, [6, 7, 8, 4, 5]) and math_rule.too_similar(a, [5, 1, 2, 3, 9])
    steps, values = [0, 10, 20, 80, 200], [1, 0.75, 0.5, 0.25, 0]
    assert [eta_at(s, steps, values) for s in (15, 80, 250)] == [0.75, 0.25, 0]
    assert latr_width(8, 0.75) == 6 and latr_width(8, 0.25) == 2 and latr_width(5, 0.5) == 2  # half to even
    settings = ForestSettings(
        8, 0.25, 0.15, PruneRule(), (20, 30, 50), return_threshold=0.98, return_threshold_decay=0.05
    )
    assert round(8 * 4 * (0.98 - 0.05 * 512 / 1024)) == 31
    forest = LatrForest(4, settings, frozenset({EOS}), lambda ids: "x")
    for tree in forest.trees:  # 30 rows of 32, all born long ago: not yet full; 31: full
        tree += [tree[0]] * 7
    forest.trees[0].pop()
    forest.trees[1].pop()
    assert not forest.full(512, 1024)
    forest.trees[1].append(forest.trees[1][0])
    assert forest.full(512, 1024)


def test_window_metrics_match_the_code_on_random_windows():
    rng = random.Random(0)
    for _ in range(500):
        r = rng.randint(1, 12)
        a = [rng.randint(0, 4) for _ in range(r)]
        b = [rng.randint(0, 4) for _ in range(r)] if rng.random() < 0.7 else a[:-1] + [9]
        assert edit_distance(a, b) == _ref_edit_distance(tuple(a), tuple(b))
        assert suffix_match(a, b) == pytest.approx(_ref_suffix_match(a, b))
        assert rouge_l(a, b) == pytest.approx(_ref_rouge_l(a, b))


# ------------------------------------------------------------------------------------------------
# The lookahead forest against a port of the code's loop


def _top2(seed, root, tokens, tau):
    """A deterministic raw top-2 for a row's context: forks often, EOS sometimes."""
    rng = random.Random(hash((seed, root, tuple(tokens))))
    first = rng.choice([EOS, 10, 11, 12, 13, 14, 15, 16]) if rng.random() < 0.1 else rng.randint(10, 16)
    second = rng.choice([t for t in range(2, 17) if t != first])
    p1 = rng.uniform(0.3, 0.9)
    p2 = (
        rng.uniform(0.0, min(p1, 1 - p1))
        if rng.random() < 0.5
        else rng.uniform(tau[0], min(p1, 1 - p1) + 1e-9)
    )
    return (first, second), (float(torch.tensor(p1).log()), float(torch.tensor(max(p2, 1e-6)).log()))


def _code_loop(seed, roots, k, settings, decode, limit, max_new):
    """The code's generate(): one global row list; finished rows take EOS; capacity by
    col * rows + row; new branches appended after every row; RolloutFilter; recursive removal."""
    rows = [{"root": p, "toks": [], "parent": None, "birth": 0} for p in range(roots)]
    steps = 0
    for step in range(limit):
        stopped = [bool(r["toks"]) and r["toks"][-1] == EOS for r in rows]
        if rows and all(stopped):
            break
        keep = {}
        for p in range(roots):
            group = [i for i, r in enumerate(rows) if r["root"] == p]
            kept = []
            for local, i in enumerate(group):
                kept.append((0, local, i))
                if not stopped[i]:
                    (t1, t2), (l1, l2) = _top2(seed, p, rows[i]["toks"], (settings.tau_abs,))
                    p1, p2 = torch.tensor(l1).exp().item(), torch.tensor(l2).exp().item()
                    if p2 > settings.tau_abs and p1 - p2 < settings.tau_rel:
                        kept.append((1, local, i))
            kept.sort(key=lambda x: x[0] * len(group) + x[1])
            for col, _, i in kept[:k]:
                keep.setdefault(i, []).append(col)
        new = []
        for i, r in enumerate(rows):
            if stopped[i]:
                r["toks"].append(EOS)
                continue
            (t1, t2), _ = _top2(seed, r["root"], r["toks"], (settings.tau_abs,))
            if 1 in keep.get(i, []):
                new.append({"root": r["root"], "toks": [*r["toks"], t2], "parent": i, "birth": step})
            r["toks"].append(t1)
        rows += new
        current = step + 1
        remove = set()
        for length in settings.windows:
            for i, r in enumerate(rows):
                if r["birth"] != current - length or r["parent"] is None:
                    continue
                a, b = r["toks"][-length:], rows[r["parent"]]["toks"][-length:]
                if EOS in a or EOS in b:
                    continue
                if settings.keep_math_symbols and decode([b[0]]).strip() in MATH_SYMBOLS:
                    continue
                if settings.prune.too_similar(a, b):
                    remove.add(i)
        grow = True
        while grow:
            grow = False
            for i, r in enumerate(rows):
                if i not in remove and r["parent"] in remove:
                    remove.add(i)
                    grow = True
        old_to_new, kept_rows = {}, []
        for i, r in enumerate(rows):
            if i not in remove:
                old_to_new[i] = len(kept_rows)
                kept_rows.append(r)
        for r in kept_rows:
            r["parent"] = None if r["parent"] is None else old_to_new[r["parent"]]
        rows = kept_rows
        steps = step + 1
        stop_now = [bool(r["toks"]) and r["toks"][-1] == EOS for r in rows]
        eff = 0
        for p in range(roots):
            group = [i for i, r in enumerate(rows) if r["root"] == p]
            eff += k if all(stop_now[i] for i in group) else len(group)
        thres = settings.return_threshold - settings.return_threshold_decay * step / max_new
        if eff >= round(k * roots * thres) and all(r["birth"] + max(settings.windows) < step for r in rows):
            break
    out = []
    for p in range(roots):
        group = []
        for r in rows:
            if r["root"] == p:
                toks = r["toks"]
                group.append(toks[: toks.index(EOS) + 1] if EOS in toks else toks)
        out.append(group)
    return out, steps


def _forest_loop(seed, roots, settings, decode, limit, max_new):
    forest = LatrForest(roots, settings, frozenset({EOS}), decode)
    steps = 0
    for step in range(limit):
        rows = forest.active()
        if not rows:
            break
        tops = [_top2(seed, b.root, b.tokens, (settings.tau_abs,)) for b in rows]
        forest.advance(step, rows, [t for t, _ in tops], [lp for _, lp in tops])
        steps = step + 1
        if forest.full(step, max_new):
            break
    return forest, steps


def _decode(ids):
    return {10: " 1", 11: " +", 12: " the", 13: "x", 14: " ", 15: "=", 16: "cat"}.get(ids[0], "w")


@pytest.mark.parametrize("seed", range(6))
def test_forest_matches_the_code_loop_on_random_streams(seed):
    """On 60 random forests per seed (widths, thresholds, lookahead lengths, each pruning metric):
    the same rows with the same tokens in the same order, after the same number of steps."""
    rng = random.Random(seed)
    seen = {"forks": 0, "pruned": 0, "suppressed": 0}
    for case in range(60):
        k = rng.randint(1, 6)
        windows = tuple(sorted(rng.sample(range(1, 7), rng.randint(1, 3))))
        prune = rng.choice([PruneRule(0.4), PruneRule(None, 0.2, 0.5), PruneRule(0.6, None, 0.3)])
        settings = ForestSettings(
            k,
            rng.choice([0.05, 0.15, 0.25]),
            rng.choice([0.15, 0.25, 0.6]),
            prune,
            windows,
            keep_math_symbols=rng.random() < 0.5,
            return_threshold=rng.choice([0.98, 0.6]),
            return_threshold_decay=rng.choice([0.0, 0.05]),
        )
        roots, max_new = rng.randint(1, 3), rng.randint(8, 24)
        limit = rng.choice([max_new, max_new // 2])
        want, want_steps = _code_loop(case * 100 + seed, roots, k, settings, _decode, limit, max_new)
        forest, steps = _forest_loop(case * 100 + seed, roots, settings, _decode, limit, max_new)
        assert [[b.tokens for b in tree] for tree in forest.trees] == want, (seed, case)
        assert steps == want_steps
        seen = {key: seen[key] + getattr(forest, key) for key in seen}
        for tree in forest.trees:
            assert 1 <= len(tree) <= k and tree[0].parent is None
            for b in tree[1:]:
                parent = b.parent
                assert parent in tree and tree.index(parent) < tree.index(b)
                assert b.tokens[: b.fork_position] == parent.tokens[: b.fork_position]
                assert b.tokens[b.fork_position] != parent.tokens[b.fork_position]
    assert seen["forks"] > 100 and seen["pruned"] > 20 and seen["suppressed"] > 100, (
        seen
    )  # each mechanism ran


def test_pruning_removes_a_branch_with_its_descendants():
    """A branch whose window repeats its parent's goes with the branch forked from it."""
    settings = ForestSettings(4, 0.1, 0.9, PruneRule(0.5), (3,), keep_math_symbols=False)
    forest = LatrForest(1, settings, frozenset({EOS}), lambda ids: "w")
    fork = ((10, 11), (-0.5, -1.0))  # p1 0.61, p2 0.37: forks
    plain = ((10, 11), (-0.01, -5.0))
    rows = forest.active()
    forest.advance(0, rows, [fork[0]], [fork[1]])  # the main row forks: [10] and [11]
    main, child = forest.trees[0]
    rows = forest.active()  # the child forks in turn, the main row does not
    forest.advance(1, rows, [(12, 13), (12, 13)], [plain[1], fork[1]])
    grandchild = forest.trees[0][2]
    assert grandchild.parent is child
    forest.advance(2, forest.active(), [(12, 13)] * 3, [plain[1]] * 3)
    # after step 2 the child (born at 0) is 3 tokens old: [11, 12, 12] vs [10, 12, 12], distance 1/3
    assert forest.trees[0] == [main] and forest.pruned == 2


# ------------------------------------------------------------------------------------------------
# The rollout on the tiny model (hf engine), and the config


def _latr_context(engine, tok, overrides, step=0, prompt_seeds=None):
    """(LATR's registry entry, a rollout context on ``engine``, 3 prompts): 12 new tokens, 6 rows."""
    from functools import partial

    from semrl.config.load import load_config
    from semrl.methods.catalog import get_method
    from semrl.methods.interface import RolloutContext
    from semrl.methods.registry import method_config
    from semrl.rollout.engines import sampling_params

    cfg = load_config(
        None, ["algorithm.method=latr", "rollout.max_new_tokens=12", "rollout.group_size=6", *overrides]
    )
    ctx = RolloutContext(
        engine,
        sampling_params(cfg.rollout, top_logprobs=False),
        torch.Generator().manual_seed(0),
        method_config(cfg, "latr"),
        lambda *a: None,
        decode=partial(tok.decode, skip_special_tokens=True),
        step=step,
        prompt_seeds=prompt_seeds,
    )
    prompts = [tok(f"Question {i}: go on")["input_ids"] for i in range(3)]
    return get_method("latr"), ctx, prompts


def _context(tiny_model_dir, overrides, step=0):
    from semrl.models.loading import load_model, load_tokenizer
    from semrl.rollout.engines.hf import HFEngine

    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    engine = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, batch_size=64)
    return _latr_context(engine, tok, overrides, step)


@pytest.mark.parametrize(("eta", "width"), [("1.0", 6), ("0.5", 3), ("0.6", 4), ("0.0", 0)])
def test_rollout_on_a_real_model(tiny_model_dir, eta, width):
    """k = round(n eta) tree rows then n - k ordinary rows per prompt; a branch repeats its parent
    up to its fork; the group's prefix tree says so; every row is within the budget."""
    method, ctx, prompts = _context(
        tiny_model_dir,
        [
            "latr.tau_abs=0.0",
            "latr.tau_rel=1.0",
            "latr.lookahead=[3]",
            "latr.keep_math_symbols=false",
            "latr.edit_distance_threshold=0.5",
            f"latr.eta_values=[{eta}]",
        ],
    )
    out = load(method.rollout_fn)(ctx, prompts)
    assert len(out.generations) == 18 and out.metrics["latr/width"] == width
    if width:
        assert out.metrics["latr/forks"] >= 3 * (width - 1)  # every token forks until the tree is full
    for p, group in enumerate(out.groups):
        tree, gens = group.tree, out.generations[6 * p : 6 * p + 6]
        for c in range(6):
            tokens = gens[c].token_ids.tolist()
            assert 1 <= len(tokens) <= 12 and gens[c].logprobs.shape == (len(tokens),)
            parent, k = tree.parents[c], tree.branch_positions[c]
            if c >= width:
                assert parent == -1  # an ordinary sample
            elif parent >= 0:
                assert tokens[:k] == gens[parent].token_ids.tolist()[:k]


def test_the_rows_per_prompt_round_to_nearest_with_ties_to_even():
    """generation.py: ``kt_n_gen = round(num_return_sequences * mix_ratio)``, Python's round. Floor
    gives fewer rows where n * eta has a fraction of 1/2 or more (6 * 0.6 = 3.6: 4 rows, not 3; the
    rollout above runs it), half-up gives more on ties with an even floor (5 * 0.5: 2, not 3)."""
    cases = {
        (6, 0.6): 4,
        (7, 0.5): 4,
        (8, 0.35): 3,
        (5, 0.5): 2,
        (9, 0.5): 4,
        (3, 0.5): 2,
        (8, 0.1): 1,
        (8, 0.05): 0,
    }
    assert {case: latr_width(*case) for case in cases} == cases


def test_the_rules_boundaries_are_the_codes():
    """sample_filter.py: a fork needs ``p2 > tau_abs`` and ``p1 - p2 < tau_rel``; a branch is pruned
    when ``edit distance / r < tau_ed``, ``suffix match > tau_sm`` or ``ROUGE-L > tau_rl``. Every
    comparison is strict, so a value on its threshold forks or survives in none of them. The values
    here are exact in binary floating point, so equality is equality."""
    assert not forks(0.5, 0.25, 0.25, 0.5)  # p2 on tau_abs
    assert forks(0.5, 0.25 + 2**-20, 0.25, 0.5)
    assert not forks(0.75, 0.5, 0.25, 0.25)  # p1 - p2 on tau_rel
    assert forks(0.75, 0.5 + 2**-20, 0.25, 0.25)
    a = [1, 2, 3, 4]
    assert edit_distance(a, [1, 2, 9, 9]) / 4 == 0.5
    assert not PruneRule(edit_distance=0.5).too_similar(a, [1, 2, 9, 9])  # on tau_ed: kept
    assert PruneRule(edit_distance=0.5 + 2**-20).too_similar(a, [1, 2, 9, 9])
    assert suffix_match(a, [9, 9, 3, 4]) == 0.5
    assert not PruneRule(edit_distance=None, suffix_match=0.5).too_similar(a, [9, 9, 3, 4])  # on tau_sm: kept
    assert PruneRule(edit_distance=None, suffix_match=0.5 - 2**-20).too_similar(a, [9, 9, 3, 4])
    assert rouge_l(a, [1, 2, 9, 9]) == 0.5
    assert not PruneRule(edit_distance=None, rouge_l=0.5).too_similar(a, [1, 2, 9, 9])  # on tau_rl: kept
    assert PruneRule(edit_distance=None, rouge_l=0.5 - 2**-20).too_similar(a, [1, 2, 9, 9])


def test_latr_config_errors_name_the_key():
    from semrl.config.load import load_config
    from semrl.errors import ConfigError

    base = ["algorithm.method=latr", "rollout.max_new_tokens=64"]
    for overrides, key in [
        (["latr.lookahead=[20,30,64]"], r"latr\.lookahead"),
        (["latr.lookahead=[]"], r"latr\.lookahead"),
        (["latr.tau_abs=1.5"], r"latr\.tau_abs"),
        (["latr.tau_rel=-0.1"], r"latr\.tau_rel"),
        (["latr.rouge_l_threshold=2"], r"latr\.rouge_l_threshold"),
        (["latr.eta_steps=[0,10]"], r"latr\.eta_steps"),
        (["latr.eta_steps=[5]"], r"latr\.eta_steps"),
        (["latr.eta_values=[1.5]"], r"latr\.eta_values"),
        (["latr.force_return_step=100"], r"latr\.force_return_step"),
        (["rollout.logprobs_top_k=1"], r"rollout\.logprobs_top_k"),
        (["rollout.group_size=1"], r"rollout\.group_size"),
        (["latr.edit_distance_threshold=null"], "edit_distance_threshold"),
    ]:
        with pytest.raises(ConfigError, match=key):
            load_config(None, [*base, *overrides])
    cfg = load_config(None, [*base, "latr.host=dr_grpo"])
    assert cfg.algorithm.loss_agg_mode == "seq-mean-token-sum-norm" and cfg.algorithm.norm_adv_by_std is False
    assert load_config(None, [*base, "latr.host=dapo"]).algorithm.loss_agg_mode == "token-mean"


# ------------------------------------------------------------------------------------------------
# The lookahead through one batched KV cache (RowLoop) against one engine request per row and token


def _peaked_model(tiny_model_dir, context: bool):
    """The tiny model with its head putting the mass on tokens 300-339, peaked enough that about a
    quarter of the positions pass the fork test below. ``context=False`` zeroes the attention and MLP
    outputs: the logits then depend on the last token only (a fixed-logit model), so both lookahead
    paths see exactly the same distributions. With ``context=True`` attention reads the row's history,
    which a row's KV must then hold (a fork's is its parent's)."""
    from semrl.models.loading import load_model

    model = load_model(str(tiny_model_dir))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(30.0 if context else 0.0)
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros_like(model.lm_head.weight)
        head[300:340] = torch.randn(40, head.shape[1], generator=torch.Generator().manual_seed(0))
    model.lm_head.weight = torch.nn.Parameter(head)  # untied from the embeddings
    return model


def _assert_same_decisions(forest, reference):
    """Two lookahead forests took the same decisions: forks, prunes and suppressed forks, every row's
    tokens, fork position, birth and end, and its log-probs to 1e-4; and the rules were exercised
    (at least 3 forks, and a prune or a suppressed fork)."""
    assert (forest.forks, forest.pruned, forest.suppressed) == (
        reference.forks,
        reference.pruned,
        reference.suppressed,
    )
    assert forest.forks >= 3 and forest.suppressed + forest.pruned >= 1
    for mine, theirs in zip(forest.trees, reference.trees, strict=True):
        assert [(b.tokens, b.fork_position, b.birth, b.finished) for b in mine] == [
            (b.tokens, b.fork_position, b.birth, b.finished) for b in theirs
        ]
        for a, b in zip(mine, theirs, strict=True):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("context", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_the_batched_lookahead_takes_the_decisions_of_one_request_per_token(tiny_model_dir, seed, context):
    """Forks, prunes, suppressed forks and every row's tokens equal between the two paths, on a
    fixed-logit model and on one whose logits read the context; the batched path makes no engine
    request at all."""
    from semrl.methods.latr.method import _lookahead_by_requests, lookahead_phase
    from semrl.methods.latr.tree import LatrForest

    method, ctx, prompts = _context(
        tiny_model_dir,
        [
            *PERMISSIVE_FORKS,
            "rollout.max_new_tokens=12",
            "rollout.group_size=6",
        ],
    )
    engine = ctx.engine
    engine.model = _peaked_model(tiny_model_dir, context)
    rng = torch.Generator().manual_seed(seed)
    prompts = [p + torch.randint(300, 340, (3,), generator=rng).tolist() for p in prompts]
    requests = engine.cost.requests
    batched, steps = lookahead_phase(ctx, prompts, 6)
    assert engine.cost.requests - requests == len(prompts)  # the loop's rows, no engine request
    reference = LatrForest(len(prompts), batched.settings, batched.eos_ids, batched.decode)
    reference_steps = _lookahead_by_requests(ctx, prompts, reference, 12)
    assert steps == reference_steps
    _assert_same_decisions(batched, reference)


def test_the_fork_test_reads_the_raw_distribution_whatever_the_sampling_settings(tiny_model_dir):
    """generation.py takes the fork candidates from ``probs_raw.topk``: the softmax of the logits
    before temperature, top-p and top-k, which shape the sampled rows only. On both lookahead paths,
    a rollout at temperature 0.5 and top-p 0.6 grows exactly the trees of one at temperature 1 and
    top-p 1. On this fixed-logit model the tempered, filtered distribution would fork differently
    at some of the tokens the rows visit, so a fork test that read it would grow other trees."""
    from semrl.methods.latr.method import _lookahead_by_requests, lookahead_phase
    from semrl.methods.latr.tree import LatrForest

    rules = [*PERMISSIVE_FORKS, "rollout.max_new_tokens=12", "rollout.group_size=6"]
    model = _peaked_model(tiny_model_dir, context=False)
    rng = torch.Generator().manual_seed(0)
    extra = [torch.randint(300, 340, (3,), generator=rng).tolist() for _ in range(3)]

    def trees(sampling: list[str]) -> list[list[list[tuple[tuple[int, ...], int]]]]:
        _, ctx, prompts = _context(tiny_model_dir, [*rules, *sampling])
        ctx.engine.model = model
        prompts = [p + e for p, e in zip(prompts, extra, strict=True)]
        batched, _ = lookahead_phase(ctx, prompts, 6)
        by_requests = LatrForest(len(prompts), batched.settings, batched.eos_ids, batched.decode)
        _lookahead_by_requests(ctx, prompts, by_requests, 12)
        return [
            [[(tuple(b.tokens), b.fork_position) for b in tree] for tree in forest.trees]
            for forest in (batched, by_requests)
        ]

    raw = trees(["rollout.temperature=1.0", "rollout.top_p=1.0"])
    assert (
        raw[0]
        == raw[1]
        == trees(["rollout.temperature=0.5", "rollout.top_p=0.6"])[0]
        == trees(["rollout.temperature=0.5", "rollout.top_p=0.6"])[1]
    )
    assert sum(len(tree) > 1 for tree in raw[0]) >= 2  # forks happened

    # the tempered, top-p filtered distribution decides otherwise at some visited token
    visited = sorted({t for tree in raw[0] for tokens, _ in tree for t in tokens})
    with torch.no_grad():
        logits = model(torch.tensor(visited)[:, None]).logits[:, -1].float()
    differ = 0
    for row in logits:
        p = torch.softmax(row, -1).topk(2).values.tolist()
        q = torch.softmax(row / 0.5, -1)
        kept = torch.cumsum(q.sort(descending=True).values, 0) - q.sort(descending=True).values < 0.6
        q_top = q.sort(descending=True).values[kept]
        q_top = (q_top / q_top.sum()).tolist() + [0.0]
        differ += forks(*p, 0.02, 0.95) != forks(q_top[0], q_top[1], 0.02, 0.95)
    assert differ >= 1


def test_the_rollout_makes_no_engine_call_per_lookahead_token(tiny_model_dir):
    """A whole LATR rollout calls the engine once (the rows' finishing), whatever the lookahead length,
    and the tree rows' finishing requests continue the lookahead's KV: each computes at most the
    last two tokens of its context (the prompt and its lookahead tokens), not the whole of it."""
    method, ctx, prompts = _context(
        tiny_model_dir,
        [
            "latr.tau_abs=0.0",
            "latr.tau_rel=1.0",
            "latr.lookahead=[3]",
            "latr.keep_math_symbols=false",
        ],
    )
    calls, original = [], ctx.engine.generate

    def counting(requests, *args, **kwargs):
        calls.append(list(requests))
        return original(requests, *args, **kwargs)

    ctx.engine.generate = counting
    before = ctx.engine.cost.prefill_tokens
    out = load(method.rollout_fn)(ctx, prompts)
    assert out.metrics["latr/lookahead_steps"] >= 4 and len(calls) == 1
    continued = [r for r in calls[0] if r.cache is not None]
    plain = [len(r.prompt_ids) + len(r.prefix_ids) for r in calls[0] if r.cache is None]
    assert len(continued) >= 6 and all(r.prefix_ids for r in continued)
    contexts = sum(len(r.prompt_ids) + len(r.prefix_ids) for r in continued)
    assert ctx.engine.cost.prefill_tokens - before <= 2 * len(continued) + sum(plain) < contexts


# ------------------------------------------------------------------------------------------------
# The lookahead as streamed vLLM requests (latr.lookahead_on=stream)

MAX_MODEL_LEN = 512  # the session's vLLM engine (tests/rollout/test_engines.py starts it with this length)
# the tests below sample from the worker's one vLLM engine (tests/conftest.py)
ON_THE_VLLM_WORKER = pytest.mark.xdist_group("vllm")


def _vllm_context(model_dir, overrides, prompt_seeds=None):
    """A LATR rollout context on the vllm engine, whose model puts its mass on tokens 300-339: their
    embeddings (tied to the head) share one direction, so each logit lifts them far above the rest
    of the vocabulary, and differ by a random part, so that about a quarter of the positions pass
    the permissive fork test (PERMISSIVE_FORKS; vLLM ignores an untied head of a tied model: the
    embeddings it is)."""
    from semrl.models.loading import load_model, load_tokenizer
    from semrl.rollout.engines import build_engine
    from tests.helpers import eager_vllm, vllm_or_skip

    vllm_or_skip()
    tok, model = load_tokenizer(str(model_dir)), load_model(str(model_dir))
    rng = torch.Generator().manual_seed(0)
    with torch.no_grad():
        embeddings = model.get_input_embeddings().weight
        direction = torch.randn(embeddings.shape[1], generator=rng)
        embeddings[300:340] = 0.3 * direction + 0.1 * torch.randn(40, embeddings.shape[1], generator=rng)
    engine = build_engine("vllm", model, tok, 64, MAX_MODEL_LEN, logprobs_top_k=20, vllm_options=eager_vllm())
    return _latr_context(engine, tok, [*PERMISSIVE_FORKS, *overrides], prompt_seeds=prompt_seeds)


@ON_THE_VLLM_WORKER
@pytest.mark.parametrize(
    ("seed", "width", "temperature"), [(0, 6, "1.0"), (1, 6, "1.0"), (2, 6, "1.0"), (3, 3, "0.6")]
)
def test_the_streamed_lookahead_takes_the_decisions_of_one_request_per_token(
    tiny32_model_dir, seed, width, temperature
):
    """Forks, prunes, suppressed forks, every row's tokens and log-probs equal those of one request per
    row and token on the same engine; the streamed lookahead makes one request per row (the prompts'
    main rows and the forks), where the reference makes one per row and token. At width 3 the
    ordinary rows sample at temperature 0.6 in the same engine steps as the greedy rows, whose top-2
    must still be the raw distribution's."""
    from semrl.methods.latr.method import _forest_settings, _lookahead_by_requests
    from semrl.methods.latr.stream import StreamedRows

    _, ctx, prompts = _vllm_context(tiny32_model_dir, [f"rollout.temperature={temperature}"])
    rng = torch.Generator().manual_seed(seed)
    prompts = [p + torch.randint(300, 340, (3,), generator=rng).tolist() for p in prompts]
    engine = ctx.engine
    engine.request_log = []
    seeded = dataclasses.replace(ctx, prompt_seeds=[1, 2, 3])
    streamed = StreamedRows(seeded, prompts, _forest_settings(ctx.config.options, width), 12)
    streamed.run()
    looked = [r for r in engine.request_log if r.tag[0] == "look"]
    engine.request_log = None
    forest = streamed.forest
    reference = LatrForest(len(prompts), forest.settings, forest.eos_ids, forest.decode)
    before = engine.cost.requests
    assert streamed.steps == _lookahead_by_requests(ctx, prompts, reference, 12)
    by_requests = engine.cost.requests - before
    _assert_same_decisions(forest, reference)
    assert len(looked) <= len(prompts) + forest.forks < by_requests
    # a pruned row's request stops at its prune, every other at the phase's end: none samples more than
    # a token or two past what the forest took from it
    assert all(len(b.tops) <= len(b.tokens) - b.stream_start + 2 for b in streamed.streams)
    # the kept rows and pads are finished from their lookahead; no row of the tree's budget or ended
    rows = [(p, j, (tree + [tree[0]] * 6)[j]) for p, tree in enumerate(forest.trees) for j in range(width)]
    kept = [(p, j) for p, j, row in rows if not row.finished and len(row.tokens) < 12]
    ordinary = [(p, j) for p in range(len(prompts)) for j in range(width, 6)]
    assert sorted(streamed.outs) == sorted(kept + ordinary)


@ON_THE_VLLM_WORKER
def test_latr_samples_on_vllm_do_not_depend_on_the_batch_limit(tiny32_model_dir):
    """With the trainer's prompt seeds, a streamed LATR rollout gives the same rows at running batches
    of 64 and 2, although its requests are served in another order."""
    from tests.helpers import vllm_batch_limit

    method, ctx, prompts = _vllm_context(tiny32_model_dir, ["latr.eta_values=[0.5]"], prompt_seeds=[5, 6, 7])
    runs, orders = [], []
    for limit in (64, 2):
        ctx.engine.request_log = []
        ctx.generator.manual_seed(0)
        with vllm_batch_limit(ctx.engine, limit):
            out = load(method.rollout_fn)(ctx, prompts)
        runs.append([g.token_ids.tolist() for g in out.generations])
        orders.append([str(r.tag) for r in ctx.engine.request_log])
    ctx.engine.request_log = None
    assert orders[0] != orders[1]
    assert runs[0] == runs[1]
    assert out.metrics["latr/forks"] >= 3


@ON_THE_VLLM_WORKER
@pytest.mark.parametrize("path", ["stream", "model"])
@pytest.mark.parametrize(("eta", "width"), [("0.5", 3), ("0.0", 0)])
def test_rollout_on_vllm(tiny32_model_dir, path, eta, width):
    """Both lookahead paths on the vllm engine: k tree rows then n - k ordinary rows per prompt, a
    branch repeats its parent up to its fork and differs at it, rows end with EOS or the budget."""
    method, ctx, prompts = _vllm_context(
        tiny32_model_dir, [f"latr.lookahead_on={path}", f"latr.eta_values=[{eta}]"]
    )
    out = load(method.rollout_fn)(ctx, prompts)
    assert len(out.generations) == 18 and out.metrics["latr/width"] == width
    assert (out.metrics["latr/forks"] >= 2) == (width > 0)
    for p, group in enumerate(out.groups):
        tree, gens = group.tree, out.generations[6 * p : 6 * p + 6]
        for c in range(6):
            tokens = gens[c].token_ids.tolist()
            assert 1 <= len(tokens) <= 12 and (gens[c].finished or len(tokens) == 12)
            parent, k = tree.parents[c], tree.branch_positions[c]
            assert (parent == -1) == (c == 0 or c >= width)
            if 0 <= parent < c < width and k < len(gens[parent].token_ids):
                assert tokens[:k] == gens[parent].token_ids.tolist()[:k]
