"""LATR's rollout as the trainer calls it: the lookahead phase over candidate branches, pruned
by ``semrl.methods.latr.tree``, then every kept branch finished by the engine.
"""

from __future__ import annotations

from dataclasses import replace

from semrl.methods.interface import MethodRollout, RolloutContext
from semrl.methods.latr import LatrConfig
from semrl.methods.latr.stream import StreamedRows, finishing_nodes, row_nodes, row_parents
from semrl.methods.latr.tree import (
    Branch,
    ForestSettings,
    LatrForest,
    PruneRule,
    eta_at,
    latr_width,
)
from semrl.rollout.batch import GroupInfo
from semrl.rollout.engines import GenerationRequest, require_power
from semrl.rollout.tree_kit import TreeSampler, chain_tree


def _forest_settings(o: LatrConfig, width: int) -> ForestSettings:
    return ForestSettings(
        width=width,
        tau_abs=o.tau_abs,
        tau_rel=o.tau_rel,
        prune=PruneRule(o.edit_distance_threshold, o.suffix_match_threshold, o.rouge_l_threshold),
        windows=tuple(o.lookahead),
        keep_math_symbols=o.keep_math_symbols,
        return_threshold=o.return_threshold,
        return_threshold_decay=o.return_threshold_decay,
    )


def lookahead_phase(ctx: RolloutContext, prompt_ids: list[list[int]], width: int) -> tuple[LatrForest, int]:
    """Grow the LATR trees of every prompt token by token; returns the forest and its loop steps.

    Every row of every prompt takes one token per forward of one batched KV cache (the engine's row
    loop, ``Engine.row_loop``): a fork copies its parent's KV row, a pruned or ended row is dropped, as
    the official code does on the transformers side before vLLM finishes the rows. Each surviving row
    then hands its KV to the finishing request where the engine continues the loop's KV (hf). An
    engine with no row loop (a plug-in's) gets one request per row and token.
    """
    o: LatrConfig = ctx.config.options
    assert ctx.decode is not None, "LATR's rollout needs RolloutContext.decode (keep_math_symbols)"
    eos = frozenset(int(t) for t in ctx.engine.eos_token_ids)
    forest = LatrForest(len(prompt_ids), _forest_settings(o, width), eos, ctx.decode)
    limit = o.force_return_step or ctx.params.max_new_tokens
    if not ctx.engine.powers.row_loop:
        return forest, _lookahead_by_requests(ctx, prompt_ids, forest, limit)
    loop = ctx.engine.row_loop()
    rows = forest.active()
    loop.start([prompt_ids[b.root] for b in rows])
    following: list[Branch] = []
    sources: list[int] = []
    steps = 0
    for step in range(limit):
        if step:
            loop.select(sources)
            loop.feed([b.tokens[-1] for b in following])
            rows = following
        top_ids, top_logprobs = loop.top2()
        forest.advance(step, rows, top_ids, top_logprobs)
        steps = step + 1
        following = forest.active()
        # a row keeps its own KV; a fork born now starts from its parent's
        position = {id(b): i for i, b in enumerate(rows)}
        sources = [position[id(b)] if id(b) in position else position[id(b.parent)] for b in following]
        if not following or forest.full(step, ctx.params.max_new_tokens):
            break
    for branch, source in zip(following, sources, strict=True):  # the finishing requests continue it
        branch.kv = loop.row_cache(source)  # None where the engine keeps KV of its own kind
    return forest, steps


def _lookahead_by_requests(
    ctx: RolloutContext, prompt_ids: list[list[int]], forest: LatrForest, limit: int
) -> int:
    """The lookahead as engine requests: every active row one request of one token per loop step."""
    # the raw distribution's two best tokens: temperature 1, no top-p / top-k
    raw = replace(ctx.params, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=1, logprobs_top_k=2)
    steps = 0
    for step in range(limit):
        rows = forest.active()
        if not rows:
            break
        requests = [
            GenerationRequest(prompt_ids[b.root], list(b.tokens), max_new_tokens=1, cache=b.kv) for b in rows
        ]
        outs = ctx.engine.generate(requests, raw, ctx.generator, reuse_kv_cache=True)
        top_ids = [(int(g.top_ids[0, 0]), int(g.top_ids[0, 1])) for g in outs]
        top_logprobs = [(float(g.top_logprobs[0, 0]), float(g.top_logprobs[0, 1])) for g in outs]
        forest.advance(step, rows, top_ids, top_logprobs, [g.cache for g in outs])
        steps = step + 1
        if forest.full(step, ctx.params.max_new_tokens):
            break
    return steps


def latr_rollout(ctx: RolloutContext, prompt_ids: list[list[int]]) -> MethodRollout:
    """n rows per prompt, prompt-major: its k LATR rows (padded with copies of the main row), then
    n - k ordinary samples. On an engine that streams (vllm) the rows are streamed requests unless
    ``latr.lookahead_on=model`` (``semrl.methods.latr.stream``); elsewhere the lookahead runs on the
    engine's row loop, and one call finishes every row (``semrl.rollout.tree_kit``)."""
    o: LatrConfig = ctx.config.options
    n, params = ctx.group_size, ctx.params
    width = latr_width(n, eta_at(ctx.step, o.eta_steps, o.eta_values))
    if o.lookahead_on == "model":
        require_power(ctx.engine, "row_loop", "LATR's lookahead on the model", "latr.lookahead_on=model")
    if ctx.engine.powers.streaming and o.lookahead_on == "stream":
        limit = o.force_return_step or params.max_new_tokens
        streamed = StreamedRows(ctx, prompt_ids, _forest_settings(o, width), limit)
        streamed.run()  # samples every row: the lookahead, its finishing and the ordinary rows
        forest, steps, kit, bases = (
            (streamed.forest if width else None),
            streamed.steps,
            streamed.kit,
            streamed.bases,
        )
    else:
        forest, steps = lookahead_phase(ctx, prompt_ids, width) if width else (None, 0)
        # the official split draws the finishing rows from the process's stream, not from node seeds
        kit = TreeSampler(ctx.engine, prompt_ids, params, ctx.generator, None, reuse_kv_cache=True)
        trees = forest.trees if forest is not None else [[] for _ in prompt_ids]
        bases = row_nodes(kit, trees, width, n, params.logprobs_top_k)
        # every finishing row is a leaf (Node.leaf): none keeps its KV
        kit.run(finishing_nodes(kit, bases, params.max_new_tokens, ordinary=True), lambda node: [])
    trees = forest.trees if forest is not None else [[] for _ in prompt_ids]
    gens, groups = [], []
    for p, rows in enumerate(bases):
        leaves = [kit.trees[p].nodes.get(j) or base for j, base in enumerate(rows)]
        mine = [leaf.response() for leaf in leaves if leaf is not None]
        gens += mine
        parents = row_parents(rows, len(trees[p]), n)
        groups.append(GroupInfo(tree=chain_tree([leaf for leaf in leaves if leaf is not None], parents)))
    metrics = {
        "latr/width": float(width),
        "latr/lookahead_steps": float(steps),
        "latr/forks": float(forest.forks if forest else 0),
        "latr/pruned": float(forest.pruned if forest else 0),
        "latr/suppressed_forks": float(forest.suppressed if forest else 0),
        "latr/padded_rows": float(sum(width - len(t) for t in trees) if forest else 0),
        "latr/lookahead_tokens": float(sum(len(b.tokens) for t in trees for b in t)),
    }
    return MethodRollout(gens, groups=groups, metrics=metrics)
