"""TreePO's rollout and advantages as the trainer calls them: the segment tree sampling of
``semrl.methods.treepo.rollout`` and the subgroup advantages of ``semrl.methods.treepo.advantages``.
"""

from __future__ import annotations

import torch

from semrl.methods.interface import AdvantageInputs, MethodRollout, RolloutContext
from semrl.methods.registry import MethodConfig
from semrl.methods.treepo import TreePOConfig
from semrl.methods.treepo.advantages import tree_outcome_advantages, whiten
from semrl.methods.treepo.rollout import (
    STOP_REASONS,
    SegmentTreeSettings,
    segment_tree_rollout,
    segments,
)
from semrl.rollout.batch import GroupInfo


def treepo_rollout(ctx: RolloutContext, prompt_ids: list[list[int]]) -> MethodRollout:
    """A segment tree of ``rollout.group_size`` leaves per prompt, prompt-major."""
    result = segment_tree_rollout(ctx, prompt_ids, SegmentTreeSettings.of(ctx))
    gens, groups = [], []
    reasons: dict[str, int] = dict.fromkeys(STOP_REASONS, 0)
    sampled = 0
    for leaves, responses, tree in zip(result.leaves, result.responses, result.trees, strict=True):
        gens += responses
        paths = tuple(tuple(node.index for node in segments(leaf)) for leaf in leaves)
        groups.append(GroupInfo(tree=tree, method_data=paths))
        for leaf in leaves:
            reasons[leaf.data or ""] += 1
        # every sampled segment lies on some leaf: count each node once
        sampled_nodes = {node for leaf in leaves for node in segments(leaf)}
        sampled += sum(len(node.response().token_ids) - node.position for node in sampled_nodes)
    total = sum(len(g.token_ids) for g in gens)
    leaves_total = len(gens)
    metrics = {
        "treepo/mean_depth": sum(len(segments(leaf)) for ls in result.leaves for leaf in ls) / leaves_total,
        "treepo/fallback_paths": float(result.fallbacks),
        "treepo/segment_steps": float(result.steps),
        "treepo/sampled_tokens": float(sampled),
        # leaves' total length = what independent sampling of the same responses would generate
        "treepo/sampled_vs_independent": sampled / max(1, total),
        **{f"treepo/stop_{reason}": count / leaves_total for reason, count in reasons.items()},
    }
    return MethodRollout(gens, groups=groups, metrics=metrics)


def treepo_advantages(
    inputs: AdvantageInputs, config: MethodConfig[TreePOConfig]
) -> tuple[torch.Tensor, dict[str, float]]:
    """(N, T) tree advantages whitened over this process's batch (each group's ``method_data``
    holds its leaves' node paths)."""
    options = config.options
    paths = [path for group in inputs.groups for path in group.method_data]
    if len(paths) != len(inputs.rewards):
        raise ValueError(
            f"{len(paths)} TreePO paths for {len(inputs.rewards)} rewards: the batch lost its trees"
        )
    raw = tree_outcome_advantages(
        inputs.rewards, inputs.group_ids.tolist(), paths, options.weight, options.drop_zero_std_subgroups
    )
    mask = inputs.response_mask.float()
    adv = whiten(raw[:, None] * mask, mask, subtract_mean=options.subtract_batch_mean)
    return adv, {"treepo/raw_advantage_abs": float(raw.abs().mean())}
