"""FR3E (First Return, Entropy-Eliciting Explore; arXiv 2507.07017, https://arxiv.org/abs/2507.07017).

Per prompt: one first-return chain; its K highest-entropy positions (paper; ``surprisal``: the K
lowest sampled-token log-probs, as the code does) are anchors. States S_0 = prompt and
S_j = prompt + chain[:anchor_j]; the G continuations of the prompt are spread over the K + 1
states (S_0 gets the first extra ones when G is not a multiple of K + 1). Continuations reuse the
first-return chain's KV cache; the prefix is part of the prompt, so only continuations are
trained on, and the first-return chain itself is not.

Advantage: per state, A = r - mean over that state's continuations (no std). States whose
continuations all got the same reward are left out of the values (FR3E's code drops them). With
v_j the share of state j's continuations whose centred score is positive, over the remaining states
in order, delta_0 = 1 - v_0 and delta_j = v_j - v_(j-1) (optionally sharpened:
sign(d)|d|^1.5 / sum |d|^1.5), and A_j <- A_j / exp(delta_j).

Pieces: this module (options, rollout, advantages, the method); docs/algorithms.md "FR3E".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from semrl.config.options import AT_LEAST_1, check_ranges, option
from semrl.errors import ConfigError
from semrl.methods.registry import MethodSpec, register_method

if TYPE_CHECKING:
    from semrl.config.sections import Config


@dataclass(frozen=True)
class FR3EConfig:
    """The ``fr3e`` config section, read when ``algorithm.method=fr3e``."""

    num_anchors: int = option(
        3, "FR3E: anchors K on the first-return chain; G is spread over K + 1 states.", valid=AT_LEAST_1
    )
    anchor_metric: Literal["entropy", "surprisal"] = option(
        "entropy", "Anchors at the highest token entropy (paper) or lowest sampled log-prob (code)."
    )
    sharpen: bool = option(True, "Sharpen the value changes: sign(d)|d|^1.5 / sum |d|^1.5 (code).")

    def __post_init__(self) -> None:
        check_ranges(self, "fr3e")


def check_fr3e(cfg: Config) -> None:
    num_anchors = cfg.section("fr3e").num_anchors
    if num_anchors + 1 > cfg.rollout.group_size:
        raise ConfigError(
            f"config key 'fr3e.num_anchors' ({num_anchors}) + 1 states exceed rollout.group_size "
            f"({cfg.rollout.group_size}); every state needs at least one continuation"
        )


def fr3e_needs_entropy(options: FR3EConfig) -> str | None:
    return "fr3e.anchor_metric=entropy" if options.anchor_metric == "entropy" else None


register_method(
    MethodSpec(
        name="fr3e",
        advantage_fn="semrl.methods.fr3e.method:fr3e_advantages",
        norm_adv_by_std=False,
        loss_agg_mode="token-mean",
        description="FR3E: continuations from the high-entropy anchors of a first-return chain, "
        "advantages modulated by exp(state-value change) (arXiv 2507.07017).",
        rollout_fn="semrl.methods.fr3e.method:fr3e_rollout",
        options=FR3EConfig,
        check=check_fr3e,
        needs_entropy=fr3e_needs_entropy,
    )
)
