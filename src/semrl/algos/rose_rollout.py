"""ROSE tree rollout ("iterative" mode, algorithms.md section 1.3).

Per prompt: a root chain, then G-1 iterations; each starts a fresh chain with probability epsilon,
otherwise re-samples from the highest-scoring position over all existing chains of that prompt
(the token at that position is re-sampled). All prompts of a batch advance together: one batched
generation call per iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from semrl.algos.branching import branch_scores
from semrl.algos.rose_tree import ChainTree
from semrl.config import RoseConfig
from semrl.rollout import Generation, GenerationRequest, RolloutEngine, SamplingParams


@dataclass
class TreeGroup:
    """One prompt's G chains (leaves) in creation order, with the tree and branch statistics."""

    generations: list[Generation]  # full responses: parent prefix + continuation
    tree: ChainTree
    branched: list[bool]  # False for the root and fresh chains
    chosen_entropy: list[float]  # H at each chosen branch point
    chosen_divergence: list[float]  # SD at each chosen branch point
    generated_tokens: int  # tokens actually sampled (prefixes are reused, not re-sampled)


def _concat(prefix: Generation, k: int, cont: Generation) -> Generation:
    return Generation(
        token_ids=torch.cat([prefix.token_ids[:k], cont.token_ids]),
        logprobs=torch.cat([prefix.logprobs[:k], cont.logprobs]),
        top_logprobs=torch.cat([prefix.top_logprobs[:k], cont.top_logprobs]),
        top_ids=torch.cat([prefix.top_ids[:k], cont.top_ids]),
        entropy=torch.cat([prefix.entropy[:k], cont.entropy]),
        finished=cont.finished,
    )


def tree_rollout(
    engine: RolloutEngine,
    prompts: list[list[int]],
    group_size: int,
    params: SamplingParams,
    unit_embeddings: torch.Tensor,
    options: RoseConfig,
    generator: torch.Generator | None = None,
) -> list[TreeGroup]:
    n = len(prompts)
    chains: list[list[Generation]] = [[] for _ in range(n)]
    scores: list[list[torch.Tensor]] = [[] for _ in range(n)]
    stats: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    parents: list[list[int]] = [[] for _ in range(n)]
    positions: list[list[int]] = [[] for _ in range(n)]
    generated = [0] * n
    for it in range(group_size):
        requests, plan = [], []
        for p in range(n):
            fresh = it == 0 or bool(torch.rand((), generator=generator) < options.epsilon)
            if not fresh:
                flat = torch.cat(scores[p])
                if flat.numel() == 0:
                    fresh = True
            if fresh:
                plan.append((-1, -1 if it == 0 else 0))
                requests.append(GenerationRequest(prompts[p]))
                continue
            best = int(torch.argmax(flat).item())  # first maximum: earliest chain wins ties
            c, k = 0, best
            while k >= len(scores[p][c]):
                k -= len(scores[p][c])
                c += 1
            plan.append((c, k))
            prefix = chains[p][c].token_ids[:k].tolist()
            requests.append(
                GenerationRequest(prompts[p], prefix_ids=prefix, max_new_tokens=params.max_new_tokens - k)
            )
        outputs = engine.generate(requests, params, generator)
        for p, ((parent, k), out) in enumerate(zip(plan, outputs, strict=True)):
            score, entropy, divergence = branch_scores(
                out.top_logprobs, out.top_ids, unit_embeddings, metric=options.branch_metric,
                entropy_mode=options.entropy_mode, full_entropy=out.entropy,
                sd_mode=options.sd_mode, sd_top_k=options.sd_top_k, generator=generator,
            )
            generated[p] += len(out.token_ids)
            if parent < 0:
                chains[p].append(out)
                scores[p].append(score)
            else:
                chains[p].append(_concat(chains[p][parent], k, out))
                scores[p].append(torch.cat([scores[p][parent][:k], score]))
                if len(entropy):
                    stats[p].append((entropy[0].item(), divergence[0].item()))
            parents[p].append(parent)
            positions[p].append(k)
    groups = []
    for p in range(n):
        tree = ChainTree(tuple(parents[p]), tuple(positions[p]), tuple(len(g.token_ids) for g in chains[p]))
        groups.append(
            TreeGroup(
                generations=chains[p], tree=tree, branched=[q >= 0 for q in parents[p]],
                chosen_entropy=[h for h, _ in stats[p]], chosen_divergence=[d for _, d in stats[p]],
                generated_tokens=generated[p],
            )
        )
    return groups
