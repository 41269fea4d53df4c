"""The 80/20 policy loss (``algorithm.policy_loss=high_entropy``): PPO on the mini-batch's
highest-entropy tokens only (``semrl.methods.token_losses.high_entropy_mask``).
"""

from __future__ import annotations

import torch

from semrl.methods.entropy_8020 import Entropy8020Config
from semrl.methods.policy_loss import MiniBatchInputs, PolicyLossInputs, ppo
from semrl.methods.registry import MethodConfig
from semrl.methods.token_losses import high_entropy_mask


def select_high_entropy(
    mb: MiniBatchInputs, config: MethodConfig[Entropy8020Config]
) -> dict[str, torch.Tensor]:
    if config.options.code_compat:  # selected per micro-batch in the loss
        return {}
    return {"keep": high_entropy_mask(mb.entropy, mb.mask, config.options.top_quantile)}


def high_entropy(
    x: PolicyLossInputs, config: MethodConfig[Entropy8020Config]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO loss on the top-entropy tokens only: those of the mini-batch's rollout entropies, or with
    ``code_compat`` those of this micro-batch's current entropies, the loss then scaled so that the
    token-mean aggregation gives mean-over-selected per micro-batch, averaged over micro-batches."""
    loss, metrics = ppo(x, config)
    if config.options.code_compat:
        if x.entropy is None:
            raise ValueError("entropy_8020.code_compat needs the current entropy")
        keep = high_entropy_mask(x.entropy, x.mask, config.options.top_quantile)
        loss = loss * (x.num_tokens / (keep.sum().clamp(min=1) * x.num_micro_batches))
    else:
        keep = x.selection["keep"]
    metrics["high_entropy_frac"] = (keep & x.mask.bool()).float().sum() / x.mask.sum().clamp(min=1)
    return torch.where(keep, loss, torch.zeros_like(loss)), metrics
