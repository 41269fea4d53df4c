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
from semrl.rollout.engines import Generation
from semrl.rollout.tree_kit import Node, TreeSampler


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

    One engine call through the tree-rollout kit (``semrl.rollout.tree_kit``): a prompt's continuations
    are submitted the moment its chain is back (on vllm they join the running batch while other chains
    still run; on hf they form the second round). Node j of prompt p (0: its chain, 1..G: its
    continuations) draws from ``node_seed(prompt seed, j)``, so the samples do not depend on
    scheduling. A continuation from anchor k > 0 continues the chain at k (its KV on hf); one from the
    prompt (state 0) is a fresh sample.
    """
    opts: FR3EConfig = ctx.config.options
    group = ctx.group_size
    kit = TreeSampler.from_context(ctx, prompt_ids, reuse_kv_cache=True)

    def on_node(node: Node) -> list[Node]:
        if node.index:  # a continuation: a leaf
            return []
        chain = kit.with_entropy(node) if opts.anchor_metric == "entropy" else node.out
        assert chain is not None
        anchors = [0, *select_anchors(anchor_scores(chain, opts.anchor_metric), opts.num_anchors)]
        tree, out = kit.trees[node.prompt], list[Node]()
        for j, (anchor, size) in enumerate(zip(anchors, state_sizes(group, len(anchors)), strict=True)):
            for _ in range(size):  # continuation c is node 1 + c
                out.append(tree.add(1 + len(out), node if anchor else None, anchor, data=j, leaf=True))
        kit.close(node.prompt)  # the chain has all its children
        return out

    kit.run([tree.add(0, entropy=opts.anchor_metric == "entropy") for tree in kit.trees], on_node)
    leaves = [[tree.nodes[1 + c] for c in range(group) if 1 + c in tree.nodes] for tree in kit.trees]
    gens = [leaf.out for row in leaves for leaf in row if leaf.out is not None]
    if len(gens) != len(prompt_ids) * group:
        raise RuntimeError(f"FR3E got {len(gens)} of {len(prompt_ids) * group} continuations back")
    states_per_group = [[leaf.data for leaf in row] for row in leaves]
    first_tokens = sum(len(t.nodes[0].out.token_ids) for t in kit.trees if t.nodes[0].out is not None)
    metrics = {
        "fr3e/anchors_per_prompt": sum(max(s) for s in states_per_group) / len(states_per_group),
        "fr3e/first_return_tokens": float(first_tokens),
    }
    return MethodRollout(
        gens,
        groups=[GroupInfo(method_data=tuple(states)) for states in states_per_group],
        sequence_prompt_ids=[kit.context(leaf) for row in leaves for leaf in row],
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
