"""SENT (arXiv 2512.04359), token level: GRPO advantages with the ``sent`` policy loss (low-entropy
tokens regularised, more strongly where Cov(logp, A) is high; algorithms.md sections 2.2-2.4).
The data-level curriculum lives in ``semrl.curriculum``."""

from __future__ import annotations

from semrl.algos.registry import MethodSpec, outcome_advantages, register_method

register_method(
    MethodSpec(
        name="sent",
        advantage_fn=outcome_advantages,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="SENT: GRPO with token-level KL on low-entropy, high-covariance tokens (arXiv 2512.04359); "
        "curriculum via data.curriculum.",
        policy_loss="sent",
    )
)
