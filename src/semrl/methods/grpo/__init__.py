"""GRPO, Dr.GRPO and DAPO: one group-relative advantage per sequence on every response token.

* GRPO (Shao et al. 2024, https://arxiv.org/abs/2402.03300): A = (r - mean) / std per group,
  per-sequence token mean.
* Dr.GRPO (Liu et al. 2025, https://arxiv.org/abs/2503.20783): A = r - mean, token sums divided by
  the response budget.
* DAPO (Yu et al. 2025, https://arxiv.org/abs/2503.14476): GRPO advantages, token mean; its other
  pieces are trainer options: clip-higher (``algorithm.clip_ratio_high``), dynamic sampling
  (``algorithm.dynamic_sampling``) and overlong shaping (``reward.overlong_buffer_len``);
  ``configs/dapo_demo.yaml`` sets them.

Formulas and aggregation modes: docs/algorithms.md, "Group-relative advantages" and
"Loss aggregation". The pure functions are ``semrl.methods.advantages`` (``outcome_advantages``) and
``semrl.methods.losses``.
"""

from __future__ import annotations

from semrl.methods.registry import MethodSpec, register_method

# GRPO's group-relative advantages, which most methods train with
OUTCOME_ADVANTAGES = "semrl.methods.advantages:outcome_advantages"

register_method(
    MethodSpec(
        name="grpo",
        advantage_fn=OUTCOME_ADVANTAGES,
        norm_adv_by_std=True,
        loss_agg_mode="seq-mean-token-mean",
        description="GRPO: (r - mean) / std per group, per-sequence token mean (arXiv 2402.03300).",
    )
)
register_method(
    MethodSpec(
        name="dr_grpo",
        advantage_fn=OUTCOME_ADVANTAGES,
        norm_adv_by_std=False,
        loss_agg_mode="seq-mean-token-sum-norm",
        description="Dr.GRPO: r - mean per group, token sums / max length (arXiv 2503.20783).",
    )
)
register_method(
    MethodSpec(
        name="dapo",
        advantage_fn=OUTCOME_ADVANTAGES,
        norm_adv_by_std=True,
        loss_agg_mode="token-mean",
        description="DAPO loss: GRPO advantages, token-mean (arXiv 2503.14476); clip-higher, dynamic "
        "sampling and overlong shaping are trainer options (configs/dapo_demo.yaml sets them).",
    )
)
