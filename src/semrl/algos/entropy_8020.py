"""The 80/20 rule (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
Effective RL for LLM Reasoning", https://arxiv.org/abs/2506.01939): GRPO advantages and the PPO
loss on the ``top_quantile`` share of a mini-batch's tokens with the highest rollout-time entropy,
the loss divided by all valid tokens. ``entropy_8020.code_compat`` does what the official code
does instead: it selects per micro-batch from the current entropies and averages the loss over the
selected tokens only (token-mean per micro-batch, averaged over the micro-batches, as verl's
gradient accumulation does).

Pieces: this module (options, the ``high_entropy`` loss and its mini-batch selection, the method),
``token_selection.high_entropy_mask`` (the pure function), docs/algorithms.md "The 80/20 rule".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from semrl.algos.grpo import outcome_advantages
from semrl.algos.policy_losses import MiniBatchInputs, PolicyLoss, PolicyLossInputs, ppo, register_policy_loss
from semrl.algos.registry import MethodConfig, MethodSpec, register_method
from semrl.algos.token_selection import high_entropy_mask
from semrl.errors import ConfigError
from semrl.options import OPEN_FRACTION, check_ranges, option

if TYPE_CHECKING:
    from semrl.config import Config


@dataclass(frozen=True)
class Entropy8020Config:
    top_quantile: float = option(
        0.2, "80/20 rule: fraction of highest-entropy tokens of a mini-batch kept in the loss.",
        valid=OPEN_FRACTION,
    )

    code_compat: bool = option(
        False, "80/20 rule as the official code: select per micro-batch from the current entropies and "
        "average the loss over the selected tokens only (needs algorithm.loss_agg_mode=token-mean)."
    )

    def __post_init__(self) -> None:
        check_ranges(self, "entropy_8020")


def check_8020(cfg: Config) -> None:
    if cfg.section("entropy_8020").code_compat and cfg.algorithm.loss_agg_mode != "token-mean":
        raise ConfigError(
            "entropy_8020.code_compat averages over the selected tokens, a token mean: set "
            f"algorithm.loss_agg_mode=token-mean (got {cfg.algorithm.loss_agg_mode})"
        )


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


register_policy_loss(
    PolicyLoss("high_entropy", high_entropy, prepare_fn=select_high_entropy, section="entropy_8020")
)
register_method(
    MethodSpec(
        name="entropy_8020",
        advantage_fn=outcome_advantages,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="80/20 rule: policy gradient on the top-20% entropy tokens only (arXiv 2506.01939).",
        policy_loss="high_entropy",
        options=Entropy8020Config,
        check=check_8020,
    )
)
