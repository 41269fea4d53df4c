"""LATR's rollout as the trainer calls it: the lookahead phase over candidate branches, pruned
by ``semrl.methods.latr.tree``, then every kept branch finished by the engine.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, cast

import torch

from semrl.methods.interface import MethodRollout, RolloutContext
from semrl.methods.latr.stream import StreamedRows, group_rows
from semrl.methods.latr.tree import (
    Branch,
    ForestSettings,
    LatrForest,
    PruneRule,
    eta_at,
    latr_width,
)
from semrl.rollout.batch import GroupInfo
from semrl.rollout.engines import Engine, Generation, GenerationRequest, join_generations
from semrl.rollout.engines.hf import RowLoop
from semrl.rollout.tree import ChainTree

if TYPE_CHECKING:
    from transformers import PreTrainedModel
from semrl.methods.latr import LatrConfig


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

    Every row of every prompt takes one token per forward of one batched KV cache (``RowLoop``): a
    fork copies its parent's KV row, a pruned or ended row is dropped, as the official code does on
    the transformers side before vLLM finishes the rows. On the hf engine each surviving row then
    hands its KV to the finishing request. Where the sampling model cannot run forwards on its own
    (a sharded model beside the vllm engine), one engine request per row and token does it.
    """
    o: LatrConfig = ctx.config.options
    assert ctx.decode is not None, "LATR's rollout needs RolloutContext.decode (keep_math_symbols)"
    eos = frozenset(int(t) for t in ctx.engine.eos_token_ids)
    forest = LatrForest(len(prompt_ids), _forest_settings(o, width), eos, ctx.decode)
    limit = o.force_return_step or ctx.params.max_new_tokens
    model = _lookahead_model(ctx.engine)
    if model is None:
        return forest, _lookahead_by_requests(ctx, prompt_ids, forest, limit)
    pad = getattr(ctx.engine, "pad_token_id", None)
    loop = RowLoop(
        model,
        ctx.engine.compute_dtype,
        pad if pad is not None else min(eos),
        ctx.engine.cost,
        getattr(ctx.engine, "sampled_by_prompt", None),
    )
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
    if ctx.engine.name == "hf":  # the finishing requests continue from each row's KV
        for branch, source in zip(following, sources, strict=True):
            branch.cache = loop.row_cache(source)
    return forest, steps


def _lookahead_model(engine: Engine) -> PreTrainedModel | None:
    """The model the engine samples from, when it can run forwards alone (not sharded)."""
    model = getattr(engine, "model", None)
    if model is None or any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return None
    return cast("PreTrainedModel", model)


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
            GenerationRequest(prompt_ids[b.root], list(b.tokens), max_new_tokens=1, cache=b.cache)
            for b in rows
        ]
        outs = ctx.engine.generate(requests, raw, ctx.generator, return_cache=True)
        top_ids = [(int(g.top_ids[0, 0]), int(g.top_ids[0, 1])) for g in outs]
        top_logprobs = [(float(g.top_logprobs[0, 0]), float(g.top_logprobs[0, 1])) for g in outs]
        forest.advance(step, rows, top_ids, top_logprobs, [g.cache for g in outs])
        steps = step + 1
        if forest.full(step, ctx.params.max_new_tokens):
            break
    return steps


def _prefix_generation(branch: Branch, top_k: int) -> Generation:
    n = len(branch.tokens)
    return Generation(
        token_ids=torch.tensor(branch.tokens, dtype=torch.long),
        logprobs=torch.tensor(branch.logprobs),
        top_logprobs=torch.zeros(n, top_k),
        top_ids=torch.zeros(n, top_k, dtype=torch.long),
        entropy=None,
        finished=branch.finished,
    )


def _finish_requests(
    ctx: RolloutContext, prompt_ids: list[list[int]], rows: list[list[Branch | None]]
) -> dict[tuple[int, int], Generation]:
    """Sample every unfinished LATR row to the end and every ordinary row (None) from its prompt,
    in one batched call; keyed by (prompt, row)."""
    params, requests, where = ctx.params, [], []
    for p, group in enumerate(rows):
        for j, branch in enumerate(group):
            if branch is None:
                requests.append(GenerationRequest(prompt_ids[p]))
            elif branch.finished or len(branch.tokens) >= params.max_new_tokens:
                continue
            else:
                budget = params.max_new_tokens - len(branch.tokens)
                prefix = list(branch.tokens)
                requests.append(GenerationRequest(prompt_ids[p], prefix, budget, cache=branch.cache))
            where.append((p, j))
    return dict(zip(where, ctx.engine.generate(requests, params, ctx.generator), strict=True))


def _group_tree(group: list[Branch | None], grown: int, lengths: list[int]) -> ChainTree:
    """The prefix tree of a prompt's rows: ``grown`` tree rows (each under its parent from its fork),
    then pads (copies of the main row's lookahead), then ordinary rows."""
    tree = [b for b in group if b is not None]
    parents, positions = [], []
    for j, branch in enumerate(group):
        if branch is None:  # an ordinary sample
            parents.append(-1)
            positions.append(0 if j else -1)
        elif j < grown:
            parent = next((i for i, b in enumerate(tree) if b is branch.parent), -1)
            parents.append(parent)
            positions.append(-1 if parent < 0 else branch.fork_position)
        else:  # a pad, sampled on from the main row's lookahead
            parents.append(0)
            positions.append(len(branch.tokens))
    return ChainTree(tuple(parents), tuple(positions), tuple(lengths))


def latr_rollout(ctx: RolloutContext, prompt_ids: list[list[int]]) -> MethodRollout:
    """n rows per prompt, prompt-major: its k LATR rows (padded with copies of the main row), then
    n - k ordinary samples. On the vllm engine the rows are streamed requests unless
    ``latr.vllm_lookahead=model`` (``semrl.methods.latr.stream``)."""
    o: LatrConfig = ctx.config.options
    n, params = ctx.group_size, ctx.params
    width = latr_width(n, eta_at(ctx.step, o.eta_steps, o.eta_values))
    streaming = ctx.engine.name == "vllm" and o.vllm_lookahead == "stream"
    if streaming:
        limit = o.force_return_step or params.max_new_tokens
        seeds = ctx.seeds_of_prompts(len(prompt_ids))
        streamed = StreamedRows(ctx, prompt_ids, _forest_settings(o, width), limit, seeds)
        streamed.run()  # samples every row: the lookahead, its finishing and the ordinary rows
        forest, steps = (streamed.forest if width else None), streamed.steps
    else:
        forest, steps = lookahead_phase(ctx, prompt_ids, width) if width else (None, 0)
    trees = forest.trees if forest is not None else [[] for _ in prompt_ids]
    rows = [group_rows(tree, width, n) for tree in trees]
    outs = streamed.outs if streaming else _finish_requests(ctx, prompt_ids, rows)

    def rest(key: tuple[int, int]) -> list[Generation]:  # a row's sampled continuation, if it had one
        return [outs[key]] if key in outs else []

    gens, groups = [], []
    for p, group in enumerate(rows):
        mine = [
            outs[(p, j)]
            if branch is None
            else join_generations([_prefix_generation(branch, params.logprobs_top_k), *rest((p, j))])
            for j, branch in enumerate(group)
        ]
        gens += mine
        groups.append(GroupInfo(tree=_group_tree(group, len(trees[p]), [len(g.token_ids) for g in mine])))
    for branch in (b for tree in trees for b in tree):
        branch.cache = None
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
