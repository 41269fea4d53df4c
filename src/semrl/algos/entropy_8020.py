"""The 80/20 rule (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
Effective RL for LLM Reasoning", https://arxiv.org/abs/2506.01939): GRPO advantages and the PPO
loss on the ``top_quantile`` share of a mini-batch's tokens with the highest rollout-time entropy.

Pieces: this module (options, the ``high_entropy`` loss and its mini-batch selection, the method),
``token_selection.high_entropy_mask`` (the pure function), docs/algorithms.md "The 80/20 rule".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from semrl.algos.grpo import outcome_advantages
from semrl.algos.policy_losses import MiniBatchInputs, PolicyLoss, PolicyLossInputs, ppo, register_policy_loss
from semrl.algos.registry import MethodSpec, register_method
from semrl.algos.token_selection import high_entropy_mask
from semrl.options import check_fraction, option


@dataclass(frozen=True)
class Entropy8020Config:
    top_quantile: float = option(
        0.2, "80/20 rule: fraction of highest-entropy tokens of a mini-batch kept in the loss."
    )

    def __post_init__(self) -> None:
        check_fraction("entropy_8020.top_quantile", self.top_quantile)


def select_high_entropy(mb: MiniBatchInputs, cfg: Any) -> dict[str, torch.Tensor]:
    return {"keep": high_entropy_mask(mb.entropy, mb.mask, cfg.entropy_8020.top_quantile)}


def high_entropy(x: PolicyLossInputs, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO loss on the mini-batch's top-entropy tokens only."""
    loss, metrics = ppo(x, cfg)
    keep = x.selection["keep"]
    metrics["high_entropy_frac"] = (keep & x.mask.bool()).float().sum() / x.mask.sum().clamp(min=1)
    return torch.where(keep, loss, torch.zeros_like(loss)), metrics


register_policy_loss(PolicyLoss("high_entropy", high_entropy, prepare_fn=select_high_entropy))
register_method(
    MethodSpec(
        name="entropy_8020",
        advantage_fn=outcome_advantages,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="80/20 rule: policy gradient on the top-20% entropy tokens only (arXiv 2506.01939).",
        policy_loss="high_entropy",
        options=Entropy8020Config,
    )
)
