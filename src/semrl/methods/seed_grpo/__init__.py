"""SEED-GRPO (arXiv 2505.12346, https://arxiv.org/abs/2505.12346): Dr.GRPO advantages scaled
down on prompts whose G answers have high semantic entropy: A_i = (r_i - mean r) * f(alpha * SE(q) / log G).

Pieces: this module (options, the advantage, the method); answer clustering and the entropy
estimators are ``semrl.methods.semantic_entropy`` (shared with SENT's curriculum);
docs/algorithms.md "SEED-GRPO".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from semrl.config.options import NON_NEGATIVE, check_ranges, option
from semrl.methods.registry import MethodSpec, register_method


@dataclass(frozen=True)
class SeedConfig:
    """The ``seed_grpo`` config section, read when ``algorithm.method=seed_grpo``."""

    alpha: float = option(1.0, "SEED-GRPO: strength; scale = f(alpha * SE / log G).", valid=NON_NEGATIVE)
    scale_fn: Literal["linear", "inverse", "exp"] = option(
        "linear", "SEED-GRPO f: 1 - x (clamped at 0), 1 / (1 + x), or exp(-x)."
    )
    likelihood: Literal["length_normalized", "frequency"] = option(
        "length_normalized", "Cluster mass: exp(mean token log-prob) per response, or counts."
    )

    def __post_init__(self) -> None:
        check_ranges(self, "seed_grpo")


register_method(
    MethodSpec(
        name="seed_grpo",
        advantage_fn="semrl.methods.seed_grpo.advantages:seed_grpo_advantages",
        norm_adv_by_std=False,
        loss_agg_mode="seq-mean-token-sum-norm",
        description="SEED-GRPO: Dr.GRPO advantages scaled by f(alpha * semantic entropy / log G) "
        "(arXiv 2505.12346).",
        options=SeedConfig,
    )
)
