"""TreePO (arXiv 2508.17445, https://arxiv.org/abs/2508.17445): segment-level tree sampling with
budget transfer and depth-first fallback, the tree-based advantage, DAPO's loss.

One step:

1. Rollout (``method.treepo_rollout`` -> ``rollout.segment_tree_rollout``): per prompt a tree of
   ``rollout.group_size`` leaves grown segment by segment (``treepo.segment_length`` tokens each,
   at most ``treepo.max_depth`` segments), ``treepo.branch`` copies per surviving path, leaves that
   stop early passing their budget on, and a fallback from a random segment boundary when a
   prompt runs out of active paths. The leaves' prefix tree goes to tree packing, which computes
   each shared segment once.
2. Advantages (``treepo_advantages``): per leaf, R minus the mean reward of the leaves sharing its
   prefix, averaged over depth levels (``advantages.tree_outcome_advantages``), then whitened over
   the batch's tokens (``advantages.whiten``).
3. Loss: DAPO's (token-mean, clip 0.2 / 0.28), as the official recipe trains it; its dynamic
   sampling and overlong shaping are trainer options (``configs/treepo_paper.yaml`` sets them).

Evaluation samples independently, as the official code validates. Where semrl follows the paper
and where the code: docs/methods/treepo.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from semrl.config.options import AT_LEAST_1, NON_NEGATIVE, check_ranges, option
from semrl.errors import ConfigError
from semrl.methods.registry import MethodSpec, register_method

if TYPE_CHECKING:
    from semrl.config.sections import Config


@dataclass(frozen=True)
class TreePOConfig:
    """The ``treepo`` config section, read when ``algorithm.method=treepo``."""

    segment_length: int = option(
        512,
        "TreePO: tokens per segment l, the unit of branching and of the fallback cut (paper and "
        "code: 512, the 14 x 512 setting). The CPU demo uses 16.",
        valid=AT_LEAST_1,
    )
    max_depth: int | None = option(
        None,
        "TreePO: segments per path at most, d. null: rollout.max_new_tokens / segment_length, "
        "which must then divide it (d x l = the response budget, as in the paper's settings).",
        valid=AT_LEAST_1,
    )
    branch: int = option(
        2,
        "TreePO: copies b of each surviving path per segment (the depth budget b^d; code's "
        "fixed_step_width 2). A leaf that stops donates its b to the survivors.",
        valid=AT_LEAST_1,
    )
    first_branch_max: int = option(
        0,
        "TreePO 'More Init Divergence': > branch draws the first fork per prompt uniformly from "
        "branch .. this (the paper's 2..8); 0: the first fork is branch too (the released script's "
        "effective setting).",
        valid=NON_NEGATIVE,
    )
    stop_on_boxed: bool = option(
        False,
        "Stop a path at a segment holding a \\boxed{} answer even without EOS (paper); false: "
        "only answer + EOS is 'finished' (code's boxed_and_eos_first); EOS alone stops a path either way.",
    )
    repetition_window: int = option(
        32,
        "TreePO early stop: a segment whose text repeats some window of this many characters ...",
        valid=AT_LEAST_1,
    )
    repetition_count: int = option(
        8,
        "... at least this many times (overlapping) becomes a leaf (code: 32 characters, 8 times).",
        valid=AT_LEAST_1,
    )
    weight: Literal["average", "group_size"] = option(
        "average",
        "Aggregation of a leaf's depth-level advantages: their mean (paper eq. 5 and the "
        "released script) or weighted by subgroup size (eq. 6; the code's default when the key is unset).",
    )
    drop_zero_std_subgroups: bool = option(
        False,
        "Leave out depth levels whose leaves all got the same reward (paper eq. 7, which it "
        "finds hurts; code's subtree_std_ds, off in the script). The prompt level always counts.",
    )
    subtract_batch_mean: bool = option(
        True,
        "Whitening subtracts the batch's token-weighted mean before dividing by the std "
        "(code's masked_whiten); false divides only (paper eq. 5).",
    )
    segment_alignment: Literal["paper", "block"] = option(
        "paper",
        "Where segments start. paper: every l tokens from the response's start (the paper's "
        "layout). block: segments a multiple of the engine's KV block size B (EnginePowers.kv_block_size; "
        "vllm: rollout.vllm_block_size), the first one shortened by (P - 1) mod B for a prompt of P "
        "tokens (and the last lengthened as much), so that every branch recomputes one context token in "
        "vLLM's prefix cache instead of up to B (a deviation, docs/methods/treepo.md). Needs "
        "segment_length to be a multiple of B. hf keeps KV per token (B = 1): the paper's layout.",
    )
    reuse_kv_cache: bool = option(
        True,
        "hf engine: continue each path from its parent's KV cache (kept until the step's trees are "
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
    block = cfg.rollout.vllm_block_size  # the vllm engine's KV block size (hf's is 1)
    if (
        options.segment_alignment == "block"
        and cfg.rollout.engine == "vllm"
        and options.segment_length % block
    ):
        raise ConfigError(
            f"config key 'treepo.segment_length' ({options.segment_length}) must be a multiple of "
            f"rollout.vllm_block_size ({block}) with treepo.segment_alignment=block; e.g. "
            f"treepo.segment_length={max(block, options.segment_length // block * block)}, or "
            "treepo.segment_alignment=paper"
        )
    if options.max_depth is None and budget % options.segment_length:
        raise ConfigError(
            f"config key 'treepo.segment_length' ({options.segment_length}) must divide "
            f"rollout.max_new_tokens ({budget}) when treepo.max_depth is null (d = max_new_tokens / "
            "segment_length); choose a divisor or set treepo.max_depth"
        )


register_method(
    MethodSpec(
        name="treepo",
        advantage_fn="semrl.methods.treepo.method:treepo_advantages",
        norm_adv_by_std=False,
        loss_agg_mode="token-mean",
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        description="TreePO: segment-level tree sampling with budget transfer and fallback, tree "
        "advantages averaged over depth levels and whitened, DAPO loss (arXiv 2508.17445).",
        rollout_fn="semrl.methods.treepo.method:treepo_rollout",
        options=TreePOConfig,
        check=check_treepo,
    )
)
