"""ROSE (arXiv 2601.05053, https://arxiv.org/abs/2601.05053): semantic-entropy tree rollouts,
epsilon-exploration, segment advantages from the prefix tree with length-aware calibration,
Dr.GRPO loss.

How it fits together, one step:

1. Rollout (``rose_rollout`` -> ``rose_rollout.tree_rollout``): per prompt a root chain, then
   G - 1 iterations; each is a fresh chain with probability ``epsilon``, otherwise a branch that
   re-samples the token at the highest-scoring position of the chains so far. The score is
   ``branching.branch_scores``: generation entropy H over the top-k log-probs x semantic divergence
   SD of the top-20 candidates' input embeddings (docs/algorithms.md "ROSE: branching metric").
2. The G chains form a prefix tree (``semrl.tree.ChainTree``), kept per group in ``GroupInfo``;
   tree packing computes each shared prefix once from it (``semrl.packing``).
3. Advantages (``rose_advantages`` -> ``rose_tree.segment_advantages``): a chain's segments
   between tree nodes get the change of node value (mean reward under the node), which telescopes
   to the Dr.GRPO advantage; then eq. 8 discounts verbose correct chains (``alpha``; correct =
   verified by the reward function, not "non-zero reward" as in the ROSE code)
   (docs/algorithms.md "ROSE: nodes and segment advantages", "ROSE: length-aware calibration").
4. Loss: Dr.GRPO's (``seq-mean-token-sum-norm``, no std), the PPO clip of ``algorithm``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from semrl.algos.branching import normalized_embeddings
from semrl.algos.registry import (
    AdvantageInputs,
    MethodConfig,
    MethodRollout,
    MethodSpec,
    RolloutContext,
    register_method,
)
from semrl.algos.rose_rollout import tree_rollout
from semrl.algos.rose_tree import segment_advantages
from semrl.batch import GroupInfo
from semrl.errors import ConfigError
from semrl.options import AT_LEAST_1, FRACTION, NON_NEGATIVE, check_ranges, option
from semrl.tree import ChainTree

if TYPE_CHECKING:
    from semrl.config import Config


@dataclass(frozen=True)
class RoseConfig:
    epsilon: float = option(
        0.5, "ROSE: probability of a fresh chain instead of a branch (1 = Dr.GRPO).", valid=FRACTION
    )
    alpha: float = option(
        1.0, "ROSE length-aware calibration exponent (eq. 8); 0 turns it off.", valid=NON_NEGATIVE
    )
    branch_metric: Literal["semantic_entropy", "entropy", "divergence", "random"] = option(
        "semantic_entropy", "Branch-point score: SD x H (ROSE), H (FR3E-style), SD, or random."
    )
    entropy_mode: Literal["topk_logprobs", "full_vocab"] = option(
        "topk_logprobs", "H over the top-k log-probs (ROSE code) or the full vocabulary (paper)."
    )
    entropy_with_sampled: bool = option(
        False,
        "With entropy_mode=topk_logprobs: add the sampled token's -p log p when it is outside the top k "
        "(20 or 21 terms), as the ROSE code does with vLLM's log-prob dictionary (docs/engines.md)."
    )
    sd_mode: Literal["rose", "normalized"] = option(
        "rose", "Semantic divergence: ROSE code formula, or the normalised non-negative variant."
    )
    sd_top_k: int = option(
        20, "Candidates used for semantic divergence (<= rollout.logprobs_top_k).", valid=AT_LEAST_1
    )
    code_compat: bool = option(
        False, "Key tree nodes by (prompt, position) like ROSE's code instead of the exact tree."
    )
    reuse_kv_cache: bool = option(
        True, "Continue branches from the parent chain's KV cache (kept until the step's trees are "
        "done); false re-encodes prompt + prefix, saving memory on long responses."
    )

    def __post_init__(self) -> None:
        check_ranges(self, "rose")


def check_rose(cfg: Config) -> None:
    if cfg.section("rose").sd_top_k > cfg.rollout.logprobs_top_k:
        raise ConfigError("config key 'rose.sd_top_k' must be <= rollout.logprobs_top_k")


def rose_needs_entropy(options: RoseConfig) -> str | None:
    return "rose.entropy_mode=full_vocab" if options.entropy_mode == "full_vocab" else None


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
    result = tree_rollout(
        ctx.engine, prompt_ids, ctx.group_size, ctx.params, unit_embeddings, options, ctx.generator,
        ctx.sampling_entropy,
    )
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
        "rose/score_time_frac": result.score_seconds / max(
            1e-9, result.score_seconds + result.generate_seconds
        ),
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
                tree, inputs.rewards[start : start + g], width, alpha=options.alpha,
                code_compat=options.code_compat,
                correct=torch.tensor(inputs.correct[start : start + g], dtype=torch.bool),
            )
        )
        start += g
    return torch.cat(out) * inputs.response_mask, {}


register_method(
    MethodSpec(
        name="rose",
        advantage_fn=rose_advantages,
        norm_adv_by_std=False,
        loss_agg_mode="seq-mean-token-sum-norm",
        description="ROSE: semantic-entropy tree rollouts, segment advantages, Dr.GRPO loss "
        "(arXiv 2601.05053).",
        rollout_fn=rose_rollout,
        options=RoseConfig,
        check=check_rose,
        needs_entropy=rose_needs_entropy,
        reads_top_logprobs=True,
    )
)
