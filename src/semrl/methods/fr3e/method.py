"""FR3E's rollout (anchors at the highest-entropy positions of a base response, continuations
from each) and its advantages (GRPO's, modulated by the anchors' states), as the trainer calls them.
"""

from __future__ import annotations

import torch

from semrl.methods.advantages import broadcast_to_tokens
from semrl.methods.fr3e import FR3EConfig
from semrl.methods.interface import AdvantageInputs, MethodRollout, RolloutContext
from semrl.methods.registry import MethodConfig
from semrl.rollout.batch import GroupInfo
from semrl.rollout.engines import Generation, GenerationRequest, node_seed


def select_anchors(scores: torch.Tensor, num_anchors: int) -> list[int]:
    """Sorted positions of the ``num_anchors`` largest scores, excluding position 0 (the prompt is S_0).

    scores: (L,) one per generated token of the first-return chain.
    """
    if len(scores) <= 1:
        return []
    k = min(num_anchors, len(scores) - 1)
    return sorted((torch.topk(scores[1:], k).indices + 1).tolist())


def state_sizes(group_size: int, num_states: int) -> list[int]:
    """Continuations per state: as even as possible, earlier states first."""
    base, extra = divmod(group_size, num_states)
    return [base + (1 if j < extra else 0) for j in range(num_states)]


def fr3e_modulation(rewards: torch.Tensor, states: torch.Tensor, sharpen: bool = True) -> torch.Tensor:
    """(G,) FR3E advantages of one prompt's continuations.

    A state whose continuations all got the same reward (all correct, all wrong, or a single
    continuation) has zero advantages and no value: as FR3E's code, which drops such state groups
    (its dynamic sampling) before computing the values, the value chain runs over the other
    states only, in order.

    Args:
        rewards: (G,) reward of each continuation.
        states: (G,) state index j of each continuation (0 = from the prompt), states ascending.
    """
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    kept: list[int] = []
    values: list[torch.Tensor] = []
    for j in range(int(states.max()) + 1):
        rows = states == j
        group = rewards[rows].float()
        if group.numel() < 2 or bool(group.max() == group.min()):
            continue
        centred = group - group.mean()
        adv[rows] = centred
        kept.append(j)
        values.append((centred > 0).float().mean())
    if not kept:
        return adv
    value = torch.stack(values)
    delta = torch.cat([1.0 - value[:1], value[1:] - value[:-1]])
    if sharpen:
        powered = delta.abs() ** 1.5
        delta = torch.sign(delta) * powered / powered.sum().clamp(min=1e-12)
    for j, d in zip(kept, delta, strict=True):
        adv[states == j] /= torch.exp(d)
    return adv


def anchor_scores(chain: Generation, metric: str) -> torch.Tensor:
    """(L,) the score of each position of a first-return chain as an anchor."""
    scores = chain.entropy if metric == "entropy" else -chain.logprobs
    if scores is None:
        raise ValueError("fr3e.anchor_metric=entropy needs the first-return chains' entropies")
    return scores


def fr3e_rollout(ctx: RolloutContext, prompt_ids: list[list[int]]) -> MethodRollout:
    """A first-return chain per prompt, then G continuations spread over its anchor states.

    One ``generate_dynamic`` call: a prompt's continuations are submitted the moment its chain is back
    (on vllm they join the running batch while other chains still run; on hf they form the second
    round). Request j of prompt p (0: its chain, 1..G: its continuations) draws from
    ``node_seed(prompt seed, j)``, so the samples do not depend on scheduling.
    """
    opts: FR3EConfig = ctx.config.options
    params, group = ctx.params, ctx.group_size
    seeds = ctx.seeds_of_prompts(len(prompt_ids))
    chains: list[Generation | None] = [None] * len(prompt_ids)
    states_per_group: list[list[int]] = [[] for _ in prompt_ids]
    sequence_prompts: list[list[list[int]]] = [[] for _ in prompt_ids]
    continuations: list[list[Generation | None]] = [[None] * group for _ in prompt_ids]

    def continuation_requests(p: int, chain: Generation) -> list[tuple[tuple[int, int], GenerationRequest]]:
        ids = prompt_ids[p]
        if opts.anchor_metric == "entropy":  # the vllm engine returns no entropy: one forward pass adds it
            chain = ctx.sampling_entropy([ids], [chain])[0]
        anchors = [0, *select_anchors(anchor_scores(chain, opts.anchor_metric), opts.num_anchors)]
        out: list[tuple[tuple[int, int], GenerationRequest]] = []
        for j, (anchor, size) in enumerate(zip(anchors, state_sizes(group, len(anchors)), strict=True)):
            prefix = chain.token_ids[:anchor].tolist()
            for _ in range(size):
                c = len(out)
                out.append(
                    (
                        (p, c),
                        GenerationRequest(
                            ids,
                            prefix,
                            params.max_new_tokens - anchor,
                            cache=chain.cache if anchor else None,
                            seed=node_seed(seeds[p], 1 + c),
                        ),
                    )
                )
                sequence_prompts[p].append(ids + prefix)
                states_per_group[p].append(j)
        return out

    def on_done(
        tag: tuple[int, int], _: GenerationRequest, out: Generation
    ) -> list[tuple[tuple[int, int], GenerationRequest]]:
        p, c = tag
        if c < 0:  # the first-return chain
            chains[p] = out
            return continuation_requests(p, out)
        continuations[p][c] = out
        return []

    first = [
        ((p, -1), GenerationRequest(ids, seed=node_seed(seeds[p], 0))) for p, ids in enumerate(prompt_ids)
    ]
    ctx.engine.generate_dynamic(first, params, ctx.generator, on_done, return_cache=True)
    gens = [g for row in continuations for g in row if g is not None]
    if len(gens) != len(prompt_ids) * group:
        raise RuntimeError(f"FR3E got {len(gens)} of {len(prompt_ids) * group} continuations back")
    for chain in chains:
        if chain is not None:
            chain.cache = None
    first_tokens = sum(len(c.token_ids) for c in chains if c is not None)
    metrics = {
        "fr3e/anchors_per_prompt": sum(max(s) for s in states_per_group) / len(states_per_group),
        "fr3e/first_return_tokens": float(first_tokens),
    }
    return MethodRollout(
        gens,
        groups=[GroupInfo(method_data=tuple(states)) for states in states_per_group],
        sequence_prompt_ids=[ids for rows in sequence_prompts for ids in rows],
        metrics=metrics,
    )


def fr3e_advantages(
    inputs: AdvantageInputs, config: MethodConfig[FR3EConfig]
) -> tuple[torch.Tensor, dict[str, float]]:
    """(N, T) advantages; each group's ``method_data`` holds the state of each continuation."""
    out, start = [], 0
    for group in inputs.groups:
        states = torch.tensor(group.method_data)
        g = len(states)
        out.append(fr3e_modulation(inputs.rewards[start : start + g], states, config.options.sharpen))
        start += g
    return broadcast_to_tokens(torch.cat(out), inputs.response_mask), {}
