"""The ROSE method (arXiv 2601.05053): semantic-entropy tree rollouts, epsilon-exploration,
segment advantages from the prefix tree with length-aware calibration, Dr.GRPO loss.

Options: the ``rose`` config section. Sections 1.2-1.6 of ``shared/design/algorithms.md``.
"""

from __future__ import annotations

from typing import Any

import torch

from semrl.algos.branching import normalized_embeddings
from semrl.algos.registry import AdvantageInputs, MethodSpec, register_method
from semrl.algos.rose_rollout import tree_rollout
from semrl.algos.rose_tree import ChainTree, segment_advantages
from semrl.rollout import Generation


def _depth(tree: ChainTree, chain: int) -> int:
    depth = 0
    while tree.parents[chain] >= 0:
        chain = tree.parents[chain]
        depth += 1
    return depth


def rose_rollout(trainer: Any, prompt_ids: list[list[int]]) -> tuple[list[Generation], dict[str, Any]]:
    """Tree rollouts for every prompt; returns the leaves prompt-major and the trees."""
    cfg = trainer.cfg
    if getattr(trainer, "_rose_embeddings", None) is None:  # once per model, not per call
        # on the CPU, beside the rollout's top-k log-probs that the scores read
        trainer._rose_embeddings = normalized_embeddings(trainer.engine.input_embeddings()).cpu()
    result = tree_rollout(
        trainer.engine, prompt_ids, cfg.rollout.group_size, trainer._sampling_params(),
        trainer._rose_embeddings, cfg.rose, trainer.generator,
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
        "rose/score_time_frac": result.score_seconds / max(1e-9, result.score_seconds + result.generate_seconds),
    }
    extras = {
        "groups": {
            "trees": [group.tree for group in groups],
            "branch_points": [group.branch_points for group in groups],
        },
        "metrics": metrics,
    }
    return gens, extras


def rose_advantages(inputs: AdvantageInputs, cfg: Any) -> torch.Tensor:
    """(N, T) segment advantages, one prefix tree per prompt group (prompt-major order)."""
    trees: list[ChainTree] = inputs.extras["groups"]["trees"]
    width = inputs.response_mask.shape[1]
    out, start = [], 0
    for tree in trees:
        g = len(tree)
        out.append(
            segment_advantages(
                tree, inputs.rewards[start : start + g], width,
                alpha=cfg.rose.alpha, code_compat=cfg.rose.code_compat,
            )
        )
        start += g
    return torch.cat(out) * inputs.response_mask


register_method(
    MethodSpec(
        name="rose",
        advantage_fn=rose_advantages,
        norm_adv_by_std=False,
        loss_agg_mode="seq-mean-token-sum-norm",
        description="ROSE: semantic-entropy tree rollouts, segment advantages, Dr.GRPO loss.",
        rollout_fn=rose_rollout,
    )
)
