"""ROSE tree rollout ("iterative" mode; docs/algorithms.md "ROSE: tree rollout").

Per prompt: a root chain, then G-1 iterations; each starts a fresh chain with probability epsilon,
otherwise re-samples from the highest-scoring position over all chains created before it (the
token at that position is re-sampled).

Scheduling. Whether an iteration is fresh does not depend on what was sampled, so the coins are
drawn up front and every fresh chain starts at once, batched with the roots. The branch iterations
of a prompt then run one at a time, in their original order: iteration i starts as soon as every
chain of its prompt with a smaller index is done, and chooses among exactly those chains, as the
sequential algorithm would. On the hf engine this runs in rounds (one batched call each; a
continuation reuses its parent chain's KV cache, ``rose.reuse_kv_cache``); on vllm a prompt's next
branch joins the running batch the moment its prompt is ready, without waiting for the slowest
prompt (``Engine.generate_dynamic``), and prefix caching does the KV reuse. The plumbing (requests,
seeds, KV, leaves, the tree) is the tree-rollout kit's (``semrl.rollout.tree_kit``); this module is
ROSE's policy: the coins, the scores and the next branch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from semrl.methods.interface import RolloutContext
from semrl.methods.rose import RoseConfig
from semrl.methods.rose.branching import branch_scores
from semrl.rollout.engines import Generation
from semrl.rollout.tree import ChainTree
from semrl.rollout.tree_kit import Node, TreeSampler, chain_tree


@dataclass
class TreeGroup:
    """One prompt's G chains (leaves) in creation order, with the tree and branch statistics."""

    generations: list[Generation]  # full responses: parent prefix + continuation
    tree: ChainTree
    branched: list[bool]  # False for the root and fresh chains
    chosen_entropy: list[float]  # H at each chosen branch point
    chosen_divergence: list[float]  # SD at each chosen branch point
    branch_points: list[tuple[float, float, float] | None]  # per chain: (H, SD, score) where it branched
    generated_tokens: int  # tokens actually sampled (prefixes are reused, not re-sampled)


@dataclass
class TreeRollout:
    """What a tree rollout returns: one ``TreeGroup`` per prompt, and its engine calls and timings."""

    groups: list[TreeGroup]  # one per prompt, in prompt order
    rounds: int  # batched generation calls (hf); 1 on vllm, which adds branches to the running batch
    generate_seconds: float  # time inside the engine
    score_seconds: float  # time computing branching scores


@dataclass
class _Chain:
    """ROSE's record of a chain (a node's ``data``): the scores of every position of its response,
    and where it branched from: (H, SD) at the chosen position and the position's score."""

    scores: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    stats: tuple[float, float] | None = None
    chosen_score: float = 0.0


def _argmax_position(chain_scores: list[torch.Tensor]) -> tuple[int, int] | None:
    """(chain, position) of the highest score; the first maximum wins, so the earliest chain wins ties."""
    flat = torch.cat(chain_scores)
    if flat.numel() == 0:
        return None
    best = int(torch.argmax(flat).item())
    chain = 0
    while best >= len(chain_scores[chain]):
        best -= len(chain_scores[chain])
        chain += 1
    return chain, best


def _last_chains(is_fresh: torch.Tensor) -> list[list[bool]]:
    """(n, g) whether no branch of prompt p comes after chain ``it`` (every later chain is fresh), so
    that no chain can continue it (``Node.leaf``: its KV is never kept)."""
    return [[bool(row[it + 1 :].all()) for it in range(len(row))] for row in is_fresh]


def tree_rollout(ctx: RolloutContext, prompts: list[list[int]], unit_embeddings: torch.Tensor) -> TreeRollout:
    """``rollout.group_size`` leaves per prompt from ROSE's iterative tree rollout.

    Args:
        ctx: the rollout's context: its engine, sampler, random stream, prompts' seeds (drawn from the
            stream when it has none), entropy forward (``sampling_entropy``: needed with
            ``entropy_mode=full_vocab`` on an engine that computes none, vllm) and ``config.options``,
            the ``rose`` section (epsilon, branch metric, modes, KV reuse).
        prompts: token ids of each prompt.
        unit_embeddings: (V, D) L2-normalised input embeddings for semantic divergence.

    Chain i of prompt p draws from ``node_seed(seed, i)`` of the prompt's seed, its epsilon coins and
    the random branch metric from the prompt's own stream, so a prompt's tree depends neither on
    scheduling nor on the other prompts of the call.
    """
    options: RoseConfig = ctx.config.options
    full_vocab = options.entropy_mode == "full_vocab"
    kit = TreeSampler.from_context(  # refuses full_vocab where neither the engine nor the context gives it
        ctx,
        prompts,
        reuse_kv_cache=options.reuse_kv_cache,
        reads_entropy="rose.entropy_mode=full_vocab" if full_vocab else None,
    )
    n, g = len(prompts), ctx.group_size
    streams = [tree.stream() for tree in kit.trees]
    # a prompt's epsilon coins come first from its own stream: its tree does not depend on the other
    # prompts of the call (nor on the number of processes)
    coins = torch.stack([torch.rand(g, generator=stream) for stream in streams])
    is_fresh = coins < options.epsilon
    is_fresh[:, 0] = True
    pending = [[it for it in range(1, g) if not is_fresh[p, it]] for p in range(n)]
    timing = {"score": 0.0}

    last = _last_chains(is_fresh)

    def branch(p: int, it: int) -> Node:
        """Chain ``it`` of prompt p: from the best position over the chains before it."""
        nodes = kit.trees[p].nodes
        choice = _argmax_position([nodes[c].data.scores for c in range(it)])
        if choice is None:
            return kit.trees[p].add(it, data=_Chain(), leaf=last[p][it], entropy=full_vocab)
        chain, k = choice
        return kit.trees[p].add(it, nodes[chain], k, data=_Chain(), leaf=last[p][it], entropy=full_vocab)

    def finish(node: Node) -> list[Node]:
        """Score a finished chain; start the prompt's next branch once every chain before it is done."""
        t0 = time.perf_counter()
        p, k, tree = node.prompt, node.position, kit.trees[node.prompt]
        out = kit.with_entropy(node) if full_vocab else node.out
        assert out is not None
        score, entropy, divergence = branch_scores(
            out.top_logprobs,
            out.top_ids,
            unit_embeddings,
            metric=options.branch_metric,
            entropy_mode=options.entropy_mode,
            full_entropy=out.entropy,
            sd_mode=options.sd_mode,
            sd_top_k=options.sd_top_k,
            generator=streams[p],
            sampled=(out.token_ids, out.logprobs) if options.entropy_with_sampled else None,
        )
        chain: _Chain = node.data
        if node.parent is None:
            chain.scores = score
        else:
            parent: _Chain = node.parent.data
            chain.chosen_score = parent.scores[k].item()
            chain.scores = torch.cat([parent.scores[:k], score])
            chain.stats = (entropy[0].item(), divergence[0].item())
        following: list[Node] = []
        if pending[p] and all(c in tree.nodes and tree.nodes[c].done for c in range(pending[p][0])):
            following.append(branch(p, pending[p].pop(0)))
        if len(tree.nodes) == g and all(c.done for c in tree.nodes.values()):
            kit.close(p)  # every chain is back: no branch can come
        timing["score"] += time.perf_counter() - t0
        return following

    first = [
        kit.trees[p].add(it, data=_Chain(), leaf=last[p][it], entropy=full_vocab)
        for p in range(n)
        for it in range(g)
        if is_fresh[p, it]
    ]
    t_start = time.perf_counter()
    rounds = kit.run(first, finish)
    total_seconds = time.perf_counter() - t_start
    timing["generate"] = total_seconds - timing["score"]

    groups = []
    for tree in kit.trees:
        chains = [tree.nodes[c] for c in range(g)]
        parents = [-1 if c.parent is None else c.parent.index for c in chains]
        stats = [c.data.stats for c in chains]
        chosen = [st for st in stats if st is not None]
        groups.append(
            TreeGroup(
                generations=[c.response() for c in chains],
                tree=chain_tree(chains, parents),
                branched=[q >= 0 for q in parents],
                chosen_entropy=[h for h, _ in chosen],
                chosen_divergence=[d for _, d in chosen],
                branch_points=[
                    None if st is None else (*st, c.data.chosen_score)
                    for c, st in zip(chains, stats, strict=True)
                ],
                generated_tokens=sum(len(c.out.token_ids) for c in chains if c.out is not None),
            )
        )
    return TreeRollout(groups, rounds, timing["generate"], timing["score"])
