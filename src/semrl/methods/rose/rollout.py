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
prompt (``Engine.generate_dynamic``), and prefix caching does the KV reuse.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from semrl.methods.rose import RoseConfig
from semrl.methods.rose.branching import branch_scores
from semrl.rollout.engines import (
    Engine,
    Generation,
    GenerationRequest,
    SamplingParams,
    node_seed,
    prompt_generator,
)
from semrl.rollout.tree import ChainTree


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
class _Job:
    prompt: int
    index: int  # iteration = chain index within the prompt's group
    parent: int  # -1 for the root and fresh chains
    position: int  # branch position k in the parent; -1 root, 0 fresh


def _concat(prefix: Generation, k: int, cont: Generation) -> Generation:
    return Generation(
        token_ids=torch.cat([prefix.token_ids[:k], cont.token_ids]),
        logprobs=torch.cat([prefix.logprobs[:k], cont.logprobs]),
        top_logprobs=torch.cat([prefix.top_logprobs[:k], cont.top_logprobs]),
        top_ids=torch.cat([prefix.top_ids[:k], cont.top_ids]),
        entropy=None
        if prefix.entropy is None or cont.entropy is None
        else torch.cat([prefix.entropy[:k], cont.entropy]),
        finished=cont.finished,
        cache=cont.cache,  # covers prompt + prefix + continuation: the whole new chain
    )


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


# One of the two functions allowed past ruff's size limits (pyproject.toml): ROSE's tree rollout
# with its per-prompt state and the callback that schedules each prompt's next branch, read as one.
def tree_rollout(  # noqa: PLR0915
    engine: Engine,
    prompts: list[list[int]],
    group_size: int,
    params: SamplingParams,
    unit_embeddings: torch.Tensor,
    options: RoseConfig,
    generator: torch.Generator | None = None,
    sampling_entropy: Callable[[list[list[int]], list[Generation]], list[Generation]] | None = None,
    prompt_seeds: list[int] | None = None,
) -> TreeRollout:
    """G leaves per prompt from ROSE's iterative tree rollout.

    Args:
        prompts: token ids of each prompt.
        unit_embeddings: (V, D) L2-normalised input embeddings for semantic divergence.
        options: the ``rose`` config section (epsilon, branch metric, modes, KV reuse).
        sampling_entropy: gives a chain the engine sampled without the full-vocabulary entropy
            it (``RolloutContext.sampling_entropy``); needed with ``entropy_mode=full_vocab`` on an
            engine that computes none (vllm).
        prompt_seeds: one seed per prompt: chain i of prompt p draws from ``node_seed(seed, i)``, its
            epsilon coins and the random branch metric from the prompt's own stream, so a prompt's
            tree depends neither on scheduling nor on the other prompts of the call. None: every draw
            comes from ``generator``, in submission order.
    """
    if options.entropy_mode == "full_vocab" and not engine.computes_entropy and sampling_entropy is None:
        raise ValueError(
            f"rose.entropy_mode=full_vocab on the {engine.name} engine, which computes no entropy: "
            "pass sampling_entropy (the trainer's RolloutContext.sampling_entropy)"
        )
    n, g = len(prompts), group_size
    streams = [generator] * n if prompt_seeds is None else [prompt_generator(seed) for seed in prompt_seeds]
    # a prompt's epsilon coins come first from its own stream: its tree does not depend on the other
    # prompts of the call (nor on the number of processes)
    coins = (
        torch.rand((n, g), generator=generator)
        if prompt_seeds is None
        else torch.stack([torch.rand(g, generator=stream) for stream in streams])
    )
    is_fresh = coins < options.epsilon
    is_fresh[:, 0] = True
    chains: list[list[Generation | None]] = [[None] * g for _ in range(n)]
    scores: list[list[torch.Tensor]] = [[torch.empty(0)] * g for _ in range(n)]
    parents = [[-1] * g for _ in range(n)]
    positions = [[-1] + [0] * (g - 1) for _ in range(n)]
    stats: list[list[tuple[float, float] | None]] = [[None] * g for _ in range(n)]
    chosen_scores: list[list[float]] = [[0.0] * g for _ in range(n)]
    generated = [0] * n
    pending = [[it for it in range(1, g) if not is_fresh[p, it]] for p in range(n)]
    timing = {"score": 0.0}

    def request_for(job: _Job) -> GenerationRequest:
        seed = None if prompt_seeds is None else node_seed(prompt_seeds[job.prompt], job.index)
        if job.parent < 0:
            return GenerationRequest(prompts[job.prompt], seed=seed)
        parent = chains[job.prompt][job.parent]
        assert parent is not None
        return GenerationRequest(
            prompts[job.prompt],
            prefix_ids=parent.token_ids[: job.position].tolist(),
            max_new_tokens=params.max_new_tokens - job.position,
            cache=parent.cache if options.reuse_kv_cache else None,
            seed=seed,
        )

    def finish(
        job: _Job, request: GenerationRequest, out: Generation
    ) -> list[tuple[_Job, GenerationRequest]]:
        """Store a finished chain; start the prompt's next branch once every chain before it is done."""
        t0 = time.perf_counter()
        p, k = job.prompt, job.position
        if options.entropy_mode == "full_vocab" and out.entropy is None:  # vllm: one forward pass
            assert sampling_entropy is not None
            out = sampling_entropy([request.prompt_ids + request.prefix_ids], [out])[0]
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
        generated[p] += len(out.token_ids)
        parents[p][job.index], positions[p][job.index] = job.parent, k
        if job.parent < 0:
            chains[p][job.index], scores[p][job.index] = out, score
        else:
            parent = chains[p][job.parent]
            assert parent is not None
            chains[p][job.index] = _concat(parent, k, out)
            chosen_scores[p][job.index] = scores[p][job.parent][k].item()
            scores[p][job.index] = torch.cat([scores[p][job.parent][:k], score])
            stats[p][job.index] = (entropy[0].item(), divergence[0].item())
        following: list[tuple[_Job, GenerationRequest]] = []
        if pending[p] and all(c is not None for c in chains[p][: pending[p][0]]):
            it = pending[p].pop(0)
            choice = _argmax_position(scores[p][:it])
            branch = _Job(p, it, -1, 0) if choice is None else _Job(p, it, *choice)
            following.append((branch, request_for(branch)))
        timing["score"] += time.perf_counter() - t0
        return following

    first = [_Job(p, it, -1, -1 if it == 0 else 0) for p in range(n) for it in range(g) if is_fresh[p, it]]
    t_start = time.perf_counter()
    rounds = engine.generate_dynamic(
        [(job, request_for(job)) for job in first],
        params,
        generator,
        finish,
        return_cache=options.reuse_kv_cache,
    )
    total_seconds = time.perf_counter() - t_start
    timing["generate"] = total_seconds - timing["score"]

    groups = []
    for p in range(n):
        leaves = [c for c in chains[p] if c is not None]
        for leaf in leaves:
            leaf.cache = None  # the trees are complete: free the KV memory
        tree = ChainTree(tuple(parents[p]), tuple(positions[p]), tuple(len(c.token_ids) for c in leaves))
        chosen = [(c, st) for c, st in enumerate(stats[p]) if st is not None]
        groups.append(
            TreeGroup(
                generations=leaves,
                tree=tree,
                branched=[q >= 0 for q in parents[p]],
                chosen_entropy=[h for _, (h, _) in chosen],
                chosen_divergence=[d for _, (_, d) in chosen],
                branch_points=[
                    None if st is None else (*st, chosen_scores[p][c]) for c, st in enumerate(stats[p])
                ],
                generated_tokens=generated[p],
            )
        )
    return TreeRollout(groups, rounds, timing["generate"], timing["score"])
