"""Each registered method's tiny-run settings, in one table: the overrides (on ``tiny_run_config``'s
tiny model and task) under which the resume test trains it (tests/runtime/test_resume_methods.py)
and the golden runs compare it from commit to commit (benchmarks/golden_runs.py). Each adds its own
variants beside these. ``tests/test_method_coverage.py`` requires a row for every registered method."""

from __future__ import annotations

from tests.helpers import every_method

TINY_RUN_SETTINGS: dict[str, list[str]] = {
    "grpo": ["algorithm.method=grpo", "algorithm.kl_coef=0.01"],
    "dr_grpo": ["trainer.ppo_epochs=2", "trainer.mini_batch_size=16"],  # the default method
    "dapo": [
        "algorithm.method=dapo",
        "algorithm.dynamic_sampling=true",
        "reward.overlong_buffer_len=2",
        "algorithm.max_sampling_rounds=3",
    ],
    "clip_cov": ["algorithm.method=clip_cov", "trainer.ppo_epochs=2", "clip_cov.ratio=0.1", "clip_cov.lb=-1"],
    "entropy_8020": ["algorithm.method=entropy_8020"],
    "fr3e": ["algorithm.method=fr3e", "rollout.max_new_tokens=6", "fr3e.num_anchors=2"],
    "kl_cov": ["algorithm.method=kl_cov", "trainer.ppo_epochs=2", "kl_cov.ratio=0.1"],
    "latr": [
        "algorithm.method=latr",
        "rollout.max_new_tokens=6",
        "latr.lookahead=[2,3]",
        "latr.tau_abs=0.02",
        "latr.tau_rel=0.9",
        "latr.eta_values=[0.5]",
        "trainer.packing=tree",
    ],
    "rose": ["algorithm.method=rose", "rollout.max_new_tokens=6", "trainer.packing=tree", "trainer.lr=5e-3"],
    "seed_grpo": ["algorithm.method=seed_grpo"],
    "sent": [
        "algorithm.method=sent",
        "trainer.ppo_epochs=2",
        "sent.kl_target=ref_k3",
        "algorithm.kl_coef=0.01",
    ],
    "treepo": [
        "algorithm.method=treepo",
        "rollout.max_new_tokens=6",
        "treepo.segment_length=2",
        "trainer.packing=tree",
        "algorithm.dynamic_sampling=true",
        "algorithm.dynamic_sampling_metric=accuracy",
    ],
}


def tiny_runs(**variants: list[str]) -> dict[str, list[str]]:
    """The table, then ``variants`` (name -> overrides), then a run with its defaults for every
    registered method neither names (a plug-in registered after the table was written)."""
    return every_method({**TINY_RUN_SETTINGS, **variants})
