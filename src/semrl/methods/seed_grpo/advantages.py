"""SEED-GRPO's advantages: GRPO's, scaled by the group's semantic entropy of answers."""

from __future__ import annotations

from typing import Literal

import torch

from semrl.methods.advantages import broadcast_to_tokens, group_centered_rewards
from semrl.methods.interface import AdvantageInputs
from semrl.methods.registry import MethodConfig
from semrl.methods.seed_grpo import SeedConfig
from semrl.methods.semantic_entropy import cluster_answers, cluster_entropy, max_entropy


def uncertainty_scale(x: torch.Tensor, scale_fn: str) -> torch.Tensor:
    """f(x) for x = alpha * SE / SE_max >= 0: ``linear`` max(0, 1 - x), ``inverse`` 1 / (1 + x),
    ``exp`` exp(-x)."""
    if scale_fn == "linear":
        return (1.0 - x).clamp(min=0.0)
    if scale_fn == "inverse":
        return 1.0 / (1.0 + x)
    if scale_fn == "exp":
        return torch.exp(-x)
    raise ValueError(f"unknown SEED-GRPO scale_fn '{scale_fn}'")


def group_semantic_entropy(
    inputs: AdvantageInputs, estimator: Literal["length_normalized", "frequency"]
) -> torch.Tensor:
    """(num_groups,) semantic entropy of each prompt's G answers (string clustering)."""
    mask = inputs.response_mask.float()
    mean_logp = None
    if estimator == "length_normalized":
        assert inputs.logprobs is not None, "SEED-GRPO needs rollout log-probs"
        mean_logp = (inputs.logprobs * mask).sum(1) / mask.sum(1).clamp(min=1)
    out = []
    for g in inputs.group_ids.unique(sorted=True).tolist():
        rows = (inputs.group_ids == g).nonzero().flatten()
        ids = cluster_answers([inputs.answers[i] for i in rows.tolist()])
        out.append(cluster_entropy(ids, None if mean_logp is None else mean_logp[rows], estimator))
    return torch.tensor(out)


def seed_grpo_advantages(
    inputs: AdvantageInputs, config: MethodConfig[SeedConfig]
) -> tuple[torch.Tensor, dict[str, float]]:
    seed = config.options
    centred = group_centered_rewards(
        inputs.rewards, inputs.group_ids, normalize_std=bool(config.algorithm.norm_adv_by_std)
    )
    entropy = group_semantic_entropy(inputs, seed.likelihood)
    group_size = int((inputs.group_ids == inputs.group_ids[0]).sum())
    scale = uncertainty_scale(seed.alpha * entropy / max(max_entropy(group_size), 1e-12), seed.scale_fn)
    metrics = {"seed/semantic_entropy": entropy.mean().item(), "seed/scale": scale.mean().item()}
    return broadcast_to_tokens(centred * scale[inputs.group_ids], inputs.response_mask), metrics
