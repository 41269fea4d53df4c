"""The 80/20 rule (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
Effective RL for LLM Reasoning", https://arxiv.org/abs/2506.01939): GRPO advantages and the PPO
loss on the ``top_quantile`` share of a mini-batch's tokens with the highest rollout-time entropy,
the loss divided by all valid tokens. ``entropy_8020.code_compat`` does what the official code
does instead: it selects per micro-batch from the current entropies and averages the loss over the
selected tokens only (token-mean per micro-batch, averaged over the micro-batches, as verl's
gradient accumulation does).

Pieces: this module (options, the ``high_entropy`` loss and its mini-batch selection, the method),
``token_losses.high_entropy_mask`` (the pure function), docs/algorithms.md "The 80/20 rule".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from semrl.config.options import OPEN_FRACTION, check_ranges, option
from semrl.errors import ConfigError
from semrl.methods.grpo import OUTCOME_ADVANTAGES
from semrl.methods.registry import MethodSpec, PolicyLoss, register_method, register_policy_loss

if TYPE_CHECKING:
    from semrl.config.sections import Config


@dataclass(frozen=True)
class Entropy8020Config:
    """The ``entropy_8020`` config section, read when ``algorithm.method=entropy_8020``."""

    top_quantile: float = option(
        0.2,
        "80/20 rule: fraction of highest-entropy tokens of a mini-batch kept in the loss.",
        valid=OPEN_FRACTION,
    )

    code_compat: bool = option(
        False,
        "80/20 rule as the official code: select per micro-batch from the current entropies and "
        "average the loss over the selected tokens only (needs algorithm.loss_agg_mode=token-mean).",
    )

    def __post_init__(self) -> None:
        check_ranges(self, "entropy_8020")


def check_8020(cfg: Config) -> None:
    if cfg.section("entropy_8020").code_compat and cfg.algorithm.loss_agg_mode != "token-mean":
        raise ConfigError(
            "entropy_8020.code_compat averages over the selected tokens, a token mean: set "
            f"algorithm.loss_agg_mode=token-mean (got {cfg.algorithm.loss_agg_mode})"
        )


register_policy_loss(
    PolicyLoss(
        "high_entropy",
        "semrl.methods.entropy_8020.loss:high_entropy",
        prepare_fn="semrl.methods.entropy_8020.loss:select_high_entropy",
        section="entropy_8020",
    )
)
register_method(
    MethodSpec(
        name="entropy_8020",
        advantage_fn=OUTCOME_ADVANTAGES,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="80/20 rule: policy gradient on the top-20% entropy tokens only (arXiv 2506.01939).",
        policy_loss="high_entropy",
        options=Entropy8020Config,
        check=check_8020,
    )
)
