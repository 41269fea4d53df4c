"""TreePO (arXiv 2508.17445, https://arxiv.org/abs/2508.17445): segment-level tree sampling with
budget transfer and depth-first fallback, the tree-based advantage, DAPO's loss.

One step:

1. Rollout (``treepo_rollout`` -> ``treepo_rollout.segment_tree_rollout``): per prompt a tree of
   ``rollout.group_size`` leaves grown segment by segment (``treepo.segment_length`` tokens each,
   at most ``treepo.max_depth`` segments), ``treepo.branch`` copies per surviving path, leaves that
   stop early passing their budget on, and a fallback from a random segment boundary when a
   prompt runs out of active paths. The leaves' prefix tree goes to tree packing, which computes
   each shared segment once.
2. Advantages (``treepo_advantages``): per leaf, R minus the mean reward of the leaves sharing its
   prefix, averaged over depth levels (``treepo_tree.tree_outcome_advantages``), then whitened over
   the batch's tokens (``treepo_tree.whiten``).
3. Loss: DAPO's (token-mean, clip 0.2 / 0.28), as the official recipe trains it; its dynamic
   sampling and overlong shaping are trainer options (``configs/treepo_paper.yaml`` sets them).

Evaluation samples independently, as the official code validates. Where semrl follows the paper
and where the code: docs/methods/treepo.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from semrl.algos.registry import (
    AdvantageInputs,
    MethodConfig,
    MethodRollout,
    MethodSpec,
    RolloutContext,
    register_method,
)
from semrl.algos.treepo_rollout import (
    STOP_REASONS,
    SegmentTreeSettings,
    leaf_tree,
    segment_tree_rollout,
)
from semrl.algos.treepo_tree import tree_outcome_advantages, whiten
from semrl.batch import GroupInfo
from semrl.engines import join_generations
from semrl.errors import ConfigError
from semrl.options import AT_LEAST_1, NON_NEGATIVE, check_ranges, option

if TYPE_CHECKING:
    from semrl.config import Config


@dataclass(frozen=True)
class TreePOConfig:
    segment_length: int = option(
        512, "TreePO: tokens per segment l, the unit of branching and of the fallback cut (paper and "
        "code: 512, the 14 x 512 setting). The CPU demo uses 16.", valid=AT_LEAST_1,
    )
    max_depth: int | None = option(
        None, "TreePO: segments per path at most, d. null: rollout.max_new_tokens / segment_length, "
        "which must then divide it (d x l = the response budget, as in the paper's settings).",
        valid=AT_LEAST_1,
    )
    branch: int = option(
        2, "TreePO: copies b of each surviving path per segment (the depth budget b^d; code's "
        "fixed_step_width 2). A leaf that stops donates its b to the survivors.", valid=AT_LEAST_1,
    )
    first_branch_max: int = option(
        0, "TreePO 'More Init Divergence': > branch draws the first fork per prompt uniformly from "
        "branch .. this (the paper's 2..8); 0: the first fork is branch too (the released script's "
        "effective setting).", valid=NON_NEGATIVE,
    )
    stop_on_boxed: bool = option(
        False, "Stop a path at a segment holding a \\boxed{} answer even without EOS (paper); false: "
        "only answer + EOS is 'finished' (code's boxed_and_eos_first); EOS alone stops a path either way.",
    )
    repetition_window: int = option(
        32, "TreePO early stop: a segment whose text repeats some window of this many characters ...",
        valid=AT_LEAST_1,
    )
    repetition_count: int = option(
        8, "... at least this many times (overlapping) becomes a leaf (code: 32 characters, 8 times).",
        valid=AT_LEAST_1,
    )
    weight: Literal["average", "group_size"] = option(
        "average", "Aggregation of a leaf's depth-level advantages: their mean (paper eq. 5 and the "
        "released script) or weighted by subgroup size (eq. 6; the code's default when the key is unset).",
    )
    drop_zero_std_subgroups: bool = option(
        False, "Leave out depth levels whose leaves all got the same reward (paper eq. 7, which it "
        "finds hurts; code's subtree_std_ds, off in the script). The prompt level always counts.",
    )
    subtract_batch_mean: bool = option(
        True, "Whitening subtracts the batch's token-weighted mean before dividing by the std "
        "(code's masked_whiten); false divides only (paper eq. 5).",
    )
    reuse_kv_cache: bool = option(
        True, "hf engine: continue each path from its parent's KV cache (kept until the step's trees are "
        "done); false re-encodes prompt + prefix. vllm reuses prefixes through its prefix cache.",
    )

    def __post_init__(self) -> None:
        check_ranges(self, "treepo")


def treepo_depth(options: TreePOConfig, max_new_tokens: int) -> int:
    """The depth limit d: ``treepo.max_depth``, or the response budget over the segment length."""
    return options.max_depth if options.max_depth is not None else max_new_tokens // options.segment_length


def check_treepo(cfg: Config) -> None:
    options: TreePOConfig = cfg.section("treepo")
    group, budget = cfg.rollout.group_size, cfg.rollout.max_new_tokens
    if group < 2:
        raise ConfigError(
            f"algorithm.method=treepo needs rollout.group_size >= 2 (the tree's width w), got {group}"
        )
    if options.branch > group:
        raise ConfigError(
            f"config key 'treepo.branch' ({options.branch}) exceeds rollout.group_size ({group}), the "
            "leaves per prompt; lower treepo.branch"
        )
    if options.first_branch_max and options.first_branch_max < options.branch:
        raise ConfigError(
            f"config key 'treepo.first_branch_max' ({options.first_branch_max}) must be 0 (off) or >= "
            f"treepo.branch ({options.branch})"
        )
    if options.segment_length > budget:
        raise ConfigError(
            f"config key 'treepo.segment_length' ({options.segment_length}) exceeds rollout.max_new_tokens "
            f"({budget}): a tree needs segments shorter than the response; e.g. "
            f"treepo.segment_length={max(1, budget // 4)}"
        )
    if options.max_depth is None and budget % options.segment_length:
        raise ConfigError(
            f"config key 'treepo.segment_length' ({options.segment_length}) must divide "
            f"rollout.max_new_tokens ({budget}) when treepo.max_depth is null (d = max_new_tokens / "
            "segment_length); choose a divisor or set treepo.max_depth"
        )


def treepo_rollout(ctx: RolloutContext, prompt_ids: list[list[int]]) -> MethodRollout:
    """A segment tree of ``rollout.group_size`` leaves per prompt, prompt-major."""
    options: TreePOConfig = ctx.config.options
    if ctx.decode is None:
        raise ValueError("TreePO's rollout needs RolloutContext.decode (its stop tests read segment text)")
    settings = SegmentTreeSettings(
        width=ctx.group_size, segment_length=options.segment_length,
        max_depth=treepo_depth(options, ctx.params.max_new_tokens), branch=options.branch,
        first_branch_max=options.first_branch_max, stop_on_boxed=options.stop_on_boxed,
        repetition_window=options.repetition_window, repetition_count=options.repetition_count,
        reuse_kv_cache=options.reuse_kv_cache,
    )
    result = segment_tree_rollout(
        ctx.engine, prompt_ids, ctx.params, settings, ctx.decode, ctx.generator
    )
    gens, groups = [], []
    reasons: dict[str, int] = dict.fromkeys(STOP_REASONS, 0)
    sampled = 0
    for leaves in result.leaves:
        gens += [join_generations(leaf.segments) for leaf in leaves]
        paths = tuple(tuple(leaf.nodes) for leaf in leaves)
        groups.append(GroupInfo(tree=leaf_tree(leaves), method_data=paths))
        for leaf in leaves:
            reasons[leaf.reason or ""] += 1
        # every sampled segment lies on some leaf: count each node once
        sizes = {n: len(s.token_ids) for x in leaves for n, s in zip(x.nodes, x.segments, strict=True)}
        sampled += sum(sizes.values())
    total = sum(len(g.token_ids) for g in gens)
    leaves_total = len(gens)
    metrics = {
        "treepo/mean_depth": sum(len(leaf.nodes) for ls in result.leaves for leaf in ls) / leaves_total,
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


register_method(
    MethodSpec(
        name="treepo",
        advantage_fn=treepo_advantages,
        norm_adv_by_std=False,
        loss_agg_mode="token-mean",
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        description="TreePO: segment-level tree sampling with budget transfer and fallback, tree "
        "advantages averaged over depth levels and whitened, DAPO loss (arXiv 2508.17445).",
        rollout_fn=treepo_rollout,
        options=TreePOConfig,
        check=check_treepo,
    )
)
