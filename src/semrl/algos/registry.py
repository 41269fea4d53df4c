"""Registry of RL methods: a method is an advantage estimator plus loss defaults.

Adding a method = one module that defines its pure functions and calls ``register_method``;
the trainer looks methods up by name and never needs editing (cf. verl ``register_adv_est``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from semrl.algos.advantages import broadcast_to_tokens, group_centered_rewards


@dataclass
class AdvantageInputs:
    """What an advantage estimator may read.

    Attributes:
        rewards: (N,) scalar reward per sequence.
        group_ids: (N,) prompt id of each sequence.
        response_mask: (N, T) 1 on response tokens.
        extras: method-specific data (tree structure, entropies, ...).
        answers: (N,) extracted final answer of each response (None: none found).
        logprobs: (N, T) rollout log-probs of the sampled tokens (0 on padding).
    """

    rewards: torch.Tensor
    group_ids: torch.Tensor
    response_mask: torch.Tensor
    extras: dict[str, Any] = field(default_factory=dict)
    answers: list[str | None] = field(default_factory=list)
    logprobs: torch.Tensor | None = None


# (inputs, the whole Config) -> (N, T) advantages
AdvantageFn = Callable[[AdvantageInputs, Any], torch.Tensor]
# (trainer, prompt token ids) -> (generations, prompt-major with group_size per prompt; extras).
# extras["sequence_prompt_ids"] (N,), if given, replaces each sequence's prompt (FR3E: prompt + prefix).
RolloutFn = Callable[[Any, list[list[int]]], tuple[list[Any], dict[str, Any]]]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    advantage_fn: AdvantageFn
    norm_adv_by_std: bool
    loss_agg_mode: str
    description: str
    rollout_fn: RolloutFn | None = None  # None: independent sampling of group_size per prompt
    policy_loss: str = "ppo"  # a name in semrl.algos.policy_losses


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    if spec.name in METHODS:
        raise ValueError(f"method '{spec.name}' is already registered")
    METHODS[spec.name] = spec
    return spec


def get_method(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method '{name}'; available: {', '.join(sorted(METHODS))}") from None


def outcome_advantages(inputs: AdvantageInputs, cfg: Any) -> torch.Tensor:
    """GRPO / Dr.GRPO: one group-relative advantage per sequence, on every response token."""
    normalize = cfg.algorithm.norm_adv_by_std
    adv = group_centered_rewards(inputs.rewards, inputs.group_ids, normalize_std=bool(normalize))
    return broadcast_to_tokens(adv, inputs.response_mask)


register_method(
    MethodSpec(
        name="grpo",
        advantage_fn=outcome_advantages,
        norm_adv_by_std=True,
        loss_agg_mode="seq-mean-token-mean",
        description="GRPO: (r - mean) / std per group, per-sequence token mean (Shao et al. 2024).",
    )
)
register_method(
    MethodSpec(
        name="dapo",
        advantage_fn=outcome_advantages,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="DAPO loss: GRPO advantages, token-mean (Yu et al. 2025); clip-higher, dynamic "
        "sampling and overlong shaping are config options (configs/dapo_demo.yaml sets them).",
    )
)
register_method(
    MethodSpec(
        name="kl_cov",
        advantage_fn=outcome_advantages,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="KL-Cov: |logp - old| penalty on the top-Cov tokens, no clipping (Cui et al. 2025).",
        policy_loss="kl_cov",
    )
)
register_method(
    MethodSpec(
        name="clip_cov",
        advantage_fn=outcome_advantages,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="Clip-Cov: gradient removed from random high-Cov tokens (Cui et al. 2025).",
        policy_loss="clip_cov",
    )
)
register_method(
    MethodSpec(
        name="entropy_8020",
        advantage_fn=outcome_advantages,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="Policy gradient on the top-20% entropy tokens only (Wang et al. 2025, 'Beyond the 80/20 rule').",
        policy_loss="high_entropy",
    )
)
register_method(
    MethodSpec(
        name="dr_grpo",
        advantage_fn=outcome_advantages,
        norm_adv_by_std=False,
        loss_agg_mode="seq-mean-token-sum-norm",
        description="Dr.GRPO: r - mean per group, token sums / max length (Liu et al. 2025).",
    )
)


def resolve_algorithm(algo_cfg: Any) -> MethodSpec:
    """Fill the method's defaults into ``algo_cfg`` where the user left them null."""
    spec = get_method(algo_cfg.method)
    if algo_cfg.norm_adv_by_std is None:
        algo_cfg.norm_adv_by_std = spec.norm_adv_by_std
    if algo_cfg.loss_agg_mode is None:
        algo_cfg.loss_agg_mode = spec.loss_agg_mode
    if algo_cfg.policy_loss is None:
        algo_cfg.policy_loss = spec.policy_loss
    return spec


# Built-in methods that live in their own modules register themselves on import.
import semrl.algos.fr3e  # noqa: E402, F401
import semrl.algos.rose  # noqa: E402, F401
import semrl.algos.seed_grpo  # noqa: E402, F401
import semrl.algos.sent  # noqa: E402, F401
