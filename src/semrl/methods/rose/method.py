"""ROSE's rollout and advantages as the trainer calls them: the tree rollout of
``semrl.methods.rose.rollout`` and the segment advantages of ``semrl.methods.rose.advantages``.
"""

from __future__ import annotations

import torch

from semrl.methods.interface import AdvantageInputs, MethodRollout, RolloutContext
from semrl.methods.registry import MethodConfig
from semrl.methods.rose import RoseConfig
from semrl.methods.rose.advantages import segment_advantages
from semrl.methods.rose.branching import normalized_embeddings
from semrl.methods.rose.rollout import tree_rollout
from semrl.rollout.batch import GroupInfo
from semrl.rollout.tree import ChainTree


def _depth(tree: ChainTree, chain: int) -> int:
    depth = 0
    while tree.parents[chain] >= 0:
        chain = tree.parents[chain]
        depth += 1
    return depth


def rose_rollout(ctx: RolloutContext, prompt_ids: list[list[int]]) -> MethodRollout:
    """Tree rollouts for every prompt: the leaves prompt-major, one tree per prompt group."""
    # from the weights the engine samples with now, as the ROSE code reads them from its rollout
    # model at every step (on the CPU, beside the top-k log-probs the scores read)
    unit_embeddings = normalized_embeddings(ctx.engine.input_embeddings()).cpu()
    options: RoseConfig = ctx.config.options
    result = tree_rollout(ctx, prompt_ids, unit_embeddings)
    groups = result.groups
    gens = [g for group in groups for g in group.generations]
    branched = sum(sum(group.branched) for group in groups)
    entropies = [h for group in groups for h in group.chosen_entropy]
    divergences = [d for group in groups for d in group.chosen_divergence]
    total_tokens = sum(len(g.token_ids) for g in gens)
    generated = sum(group.generated_tokens for group in groups)
    metrics = {
        "rose/branched_chains": float(branched),
        "rose/fresh_chains": float(len(gens) - branched),
        "rose/max_tree_depth": float(max(_depth(gr.tree, c) for gr in groups for c in range(len(gr.tree)))),
        "rose/branch_entropy": float(sum(entropies) / len(entropies)) if entropies else 0.0,
        "rose/branch_divergence": float(sum(divergences) / len(divergences)) if divergences else 0.0,
        "rose/generated_tokens": float(generated),
        # leaves' total length = what independent sampling of the same responses would generate
        "rose/generated_vs_independent": generated / max(1, total_tokens),
        "rose/generation_rounds": float(result.rounds),
        "rose/score_time_frac": result.score_seconds
        / max(1e-9, result.score_seconds + result.generate_seconds),
    }
    infos = [
        GroupInfo(
            tree=group.tree, branch_points=tuple(group.branch_points), nodes_by_position=options.code_compat
        )
        for group in groups
    ]
    return MethodRollout(gens, groups=infos, metrics=metrics)


def rose_advantages(
    inputs: AdvantageInputs, config: MethodConfig[RoseConfig]
) -> tuple[torch.Tensor, dict[str, float]]:
    """(N, T) segment advantages, one prefix tree per prompt group (prompt-major order)."""
    options, width = config.options, inputs.response_mask.shape[1]
    out, start = [], 0
    for group in inputs.groups:
        tree = group.tree
        assert tree is not None, "ROSE advantages need the rollout's trees"
        g = len(tree)
        out.append(
            segment_advantages(
                tree,
                inputs.rewards[start : start + g],
                width,
                alpha=options.alpha,
                code_compat=options.code_compat,
                correct=torch.tensor(inputs.correct[start : start + g], dtype=torch.bool),
            )
        )
        start += g
    return torch.cat(out) * inputs.response_mask, {}
