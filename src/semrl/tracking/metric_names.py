"""The names of the logged metrics that reports and studies read (``semrl compare``, ``semrl report``,
the end-of-run table, the study rules): one place, so that a renamed metric fails
``tests/tracking/test_metric_names.py`` instead of silently emptying a report. The trainer writes them
(``semrl.tracking.metrics``, the update, the methods' rollouts); the test checks a tiny run's log.
"""

from __future__ import annotations

# every step
REWARD = "reward"
ACCURACY = "accuracy"
ENTROPY = "entropy"
LOW_ENTROPY_FRAC = "entropy/low_frac"
RESPONSE_LENGTH = "response_length"
CORRECT_LENGTH = "response_length/correct"
TRUNCATED_FRAC = "response_length/truncated_frac"
DISTINCT_ANSWERS = "reward/distinct_answers_per_group"
ALL_EQUAL = "reward/frac_groups_all_equal"  # 1: every group's rewards equal, so no policy gradient
CLIP_FRAC = "actor/clip_frac"
GRAD_NORM = "actor/grad_norm"
CURRICULUM_STAGE = "curriculum/stage"
STEP_S = "time/step_s"
# where a step's time goes (docs/training.md, "Where a step's time goes")
ROLLOUT_S = "time/rollout_s"
SAMPLING_S = "time/rollout/sampling_s"  # inside the engine's sampling
AROUND_SAMPLING_S = "time/rollout/around_s"  # the rest: the method's tree logic, entropy forwards
REWARD_S = "time/reward_s"
UPDATE_S = "time/update_s"  # the sum of the update's phases
UPDATE_PHASES = (  # time/update/<phase>_s, timed where they run (semrl.core.timing.PhaseClock)
    ("advantages", "advantages"),
    ("old_logprobs", "old log-probs (no grad)"),
    ("ref_logprobs", "reference log-probs"),
    ("forward", "forward + loss"),
    ("backward", "backward"),
    ("optimizer", "optimizer step"),
    ("sync", "weight sync to the engine"),
)
# what a step's rollout cost (docs/engines.md, "What a rollout costs")
SAMPLED_TOKENS = "rollout/sampled_tokens"  # the compute axis of semrl compare
PREFILL_TOKENS = "rollout/prefill_tokens"
ENGINE_STEPS = "rollout/engine_steps"
RUNNING_BATCH = "rollout/running_batch"
TOKENS_PER_S = "time/rollout_tokens_per_s"
TRAJECTORIES_PER_S = "time/rollout_trajectories_per_s"
COST = (SAMPLED_TOKENS, PREFILL_TOKENS, ENGINE_STEPS, RUNNING_BATCH, TOKENS_PER_S, TRAJECTORIES_PER_S)
# on a step whose children forked their parents' KV inside vLLM, or asked to and could not
FORKED_REQUESTS = "rollout/forked_requests"
FORK_FALLBACKS = "rollout/fork_fallbacks"
HOLDS_REFUSED = "rollout/holds_refused"

# only where the run has them
KL = "kl"  # a KL term (algorithm.kl_coef > 0, SENT)
ROSE = (
    "rose/branched_chains",
    "rose/generated_vs_independent",
    "rose/branch_entropy",
    "rose/branch_divergence",
)
EVAL_S = "time/eval_s"  # a step with an evaluation
EVAL_PROBLEMS = "eval/problems"

EVERY_STEP = (
    REWARD,
    ACCURACY,
    ENTROPY,
    LOW_ENTROPY_FRAC,
    RESPONSE_LENGTH,
    CORRECT_LENGTH,
    TRUNCATED_FRAC,
    DISTINCT_ANSWERS,
    ALL_EQUAL,
    CLIP_FRAC,
    GRAD_NORM,
    CURRICULUM_STAGE,
    STEP_S,
    ROLLOUT_S,
    SAMPLING_S,
    AROUND_SAMPLING_S,
    REWARD_S,
    UPDATE_S,
    *(f"time/update/{phase}_s" for phase in ("advantages", "forward", "backward", "optimizer", "sync")),
    *COST,
)
