"""The ``algorithm``, ``trainer`` and ``logging`` sections: how a run learns from its rewards,
its loop, and what it records."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal

from semrl.config.options import (
    AT_LEAST_1,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    Range,
    option,
)
from semrl.errors import ConfigError

# name (also the module imported) -> what pip installs it (tensorboard is a core dependency)
TRACKERS = {
    "tensorboard": "tensorboard",
    "wandb": "'semrl[wandb]'",
    "trackio": "'semrl[trackio]'",
    "mlflow": "'semrl[mlflow]'",
}


def check_trackers(names: list[str]) -> None:
    """Fail at config load on an unknown tracker or one whose package is missing."""
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(
                f"config key 'logging.report_to': unknown tracker '{name}'; choose from {', '.join(TRACKERS)}"
            )
        if importlib.util.find_spec(name) is None:
            raise ConfigError(
                f"config key 'logging.report_to' names {name}, which is not installed: "
                f"pip install {TRACKERS[name]} (or remove it from logging.report_to)"
            )


@dataclass(frozen=True)
class AlgorithmConfig:
    """The ``algorithm`` section: the method and what every method shares (advantages, loss, KL, dynamic
    sampling, the entropy bonus)."""

    method: str = option(
        "dr_grpo",
        "Method from the registry; the table of methods below (and 'semrl config --methods') "
        "lists them. A method's own options are in the section named after it.",
    )
    policy_loss: str | None = option(
        None,
        "Per-token policy loss from the registry of losses "
        "(null: the method's); the table of methods lists them.",
    )
    norm_adv_by_std: bool | None = option(
        None, "Divide group-centred rewards by the group std (null: the method's default)."
    )
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] | None = option(
        None, "Loss aggregation (null: the method's default); docs/algorithms.md, section Loss aggregation."
    )
    clip_ratio_low: float | None = option(
        None,
        "PPO clip epsilon below 1 (ratio >= 1 - eps_low); "
        "null: the method's (0.2; Clip-Cov 1.0, its recipes').",
        valid=FRACTION,
    )
    clip_ratio_high: float | None = option(
        None,
        "PPO clip epsilon above 1 (DAPO clip-higher: 0.28); null: the method's (0.2; Clip-Cov 1.0).",
        valid=NON_NEGATIVE,
    )
    clip_ratio_c: float = option(
        3.0,
        "Dual-clip constant for negative advantages (verl default 3).",
        valid=Range(1, None, low_open=True),
    )
    kl_coef: float = option(
        0.0, "KL-to-reference coefficient beta; 0 loads no reference model.", valid=NON_NEGATIVE
    )
    kl_estimator: Literal["k1", "k2", "k3"] = option("k3", "KL estimator (k3 = verl low_var_kl).")
    dynamic_sampling: bool = option(
        False,
        "Drop groups whose rewards are all equal and sample more prompts until the batch is "
        "full (DAPO; verl: algorithm.filter_groups.enable).",
    )
    dynamic_sampling_metric: Literal["reward", "accuracy"] = option(
        "reward",
        "What must vary within a group for dynamic sampling to keep it: the final reward, "
        "overlong shaping included (verl metric seq_final_reward, as ROSE's code), or correctness "
        "(acc, DAPO's recipe).",
    )
    max_sampling_rounds: int = option(
        8,
        "Rollout batches per step at most with dynamic sampling (verl: max_num_gen_batches); a "
        "batch still short is filled with dropped, zero-advantage groups.",
        valid=AT_LEAST_1,
    )
    entropy_coeff: float = option(
        0.0,
        "Entropy bonus for every method (verl's actor.entropy_coeff, TRL's entropy_coef): the loss "
        "becomes pg_loss - entropy_coeff x H, H the full-vocabulary entropy of the temperature-scaled "
        "distribution, with its gradient, aggregated with algorithm.loss_agg_mode like the policy "
        "term; > 0 raises the entropy. 0: off. SENT's 'w/ En' baseline: 0.001 "
        "(configs/sent_entropy_bonus.yaml). docs/algorithms.md, Entropy bonus.",
        valid=NON_NEGATIVE,
    )
    entropy_target: float | None = option(
        None,
        "Adaptive entropy bonus (TRL's use_adaptive_entropy, after Skywork-OR1): after each "
        "optimizer step the coefficient, starting at entropy_coeff, moves up by entropy_coeff_delta when "
        "the step's mean token entropy is <= this target (nats) and down otherwise, within "
        "[entropy_coeff_min, entropy_coeff_max]; the next step applies the bonus only when it was <= "
        "target. null: a fixed coefficient.",
        valid=NON_NEGATIVE,
    )
    entropy_coeff_delta: float = option(
        0.005,
        "Adaptive entropy bonus: the coefficient's step per optimizer step (TRL's default).",
        valid=NON_NEGATIVE,
    )
    entropy_coeff_min: float = option(
        0.0, "Adaptive entropy bonus: lower bound of the coefficient.", valid=NON_NEGATIVE
    )
    entropy_coeff_max: float = option(
        1.0, "Adaptive entropy bonus: upper bound of the coefficient.", valid=NON_NEGATIVE
    )
    rollout_is: Literal["none", "token", "sequence"] = option(
        "none",
        "Correct the engine/trainer mismatch: weight each token's policy loss by pi_old / pi_engine "
        "of its token (token) or of its whole response (sequence), truncated at rollout_is_cap (verl: "
        "rollout_is; TRL: vllm_importance_sampling_correction). docs/algorithms.md, Rollout correction.",
    )
    rollout_is_cap: float = option(
        2.0, "Upper cap C of the rollout-correction weights (> 0).", valid=POSITIVE
    )
    rollout_is_mode: Literal["truncate", "mask"] = option(
        "truncate", "Above the cap: use C (truncated IS) or drop the token / sequence from the loss (mask)."
    )


@dataclass(frozen=True)
class TrainerConfig:
    """The ``trainer`` section: steps, learning rate, batches, epochs, precision, processes and FSDP."""

    steps: int = option(10, "Number of rollout-update steps.", valid=NON_NEGATIVE)
    lr: float = option(1e-6, "AdamW learning rate.", valid=POSITIVE)
    weight_decay: float = option(0.0, "AdamW weight decay.", valid=NON_NEGATIVE)
    betas: list[float] = option([0.9, 0.999], "AdamW betas.", valid=Range(0, 1, high_open=True))
    warmup_steps: int = option(0, "Linear learning-rate warm-up, in optimizer steps.", valid=NON_NEGATIVE)
    lr_schedule: Literal["constant", "cosine", "linear"] = option(
        "constant", "Learning-rate schedule after warm-up."
    )
    max_grad_norm: float = option(1.0, "Gradient-norm clipping threshold.", valid=POSITIVE)
    ppo_epochs: int = option(1, "Passes over each rollout batch.", valid=AT_LEAST_1)
    mini_batch_size: int | None = option(
        None,
        "Sequences per optimizer step (null: the whole rollout batch, one step).",
        valid=AT_LEAST_1,
    )
    micro_batch_size: int = option(
        8, "Sequences per forward/backward (gradient accumulation).", valid=AT_LEAST_1
    )
    micro_batch_tokens: int | None = option(
        None,
        "Token budget per forward/backward instead of micro_batch_size: rows sorted by length fill "
        "micro-batches of at most this many tokens as the model sees them (padding or packed rows "
        "included), a longer row alone; processes run the same number of micro-batches. verl's "
        "use_dynamic_bsz with ppo_max_token_len_per_gpu.",
        valid=AT_LEAST_1,
    )
    logits_chunk_size: int = option(
        256,
        "Response tokens whose full-vocabulary logits exist at once when computing log-probs and "
        "entropies (training forward, old-policy and reference passes); recomputed in backward. "
        "Extra memory about 2 x this x vocabulary x 4 bytes (besides the gradients), whatever the "
        "micro-batch size.",
        valid=AT_LEAST_1,
    )
    packing: Literal["none", "tree"] = option(
        "tree",
        "tree: the rows of each prompt group go through the model packed, the prompt and every shared "
        "tree prefix computed once, groups sharing rows (tree attention in memory linear in the tokens: "
        'docs/algorithms.md "Tree packing"); micro-batches then take whole groups in a shuffled group '
        "order. Same log-probs, loss and gradients as 'none' (padded rows), the fallback for model types "
        "it does not know.",
    )
    fsdp: bool = option(
        False,
        "Shard parameters, gradients and optimizer state over the processes (FSDP2 on each decoder "
        "layer). Rollouts use a full copy of the weights gathered after every update.",
    )
    max_bad_updates: int = option(
        3,
        "Optimizer updates in a row whose loss or gradient norm is NaN/inf (each is skipped) before "
        "the run stops with a checkpoint; 0: never stop.",
        valid=NON_NEGATIVE,
    )
    seed: int = option(0, "Seed for data order, sampling and initialisation.", valid=NON_NEGATIVE)
    num_threads: int | None = option(
        None,
        "torch CPU threads. null: torch's default (OMP_NUM_THREADS when set, else the machine's "
        "cores), capped at the cores this process may run on (its CPU affinity).",
        valid=AT_LEAST_1,
    )


@dataclass(frozen=True)
class LoggingConfig:
    """The ``logging`` section: output directory, checkpoints, evaluation during training, trackers."""

    output_dir: str = option(
        "auto",
        "Run directory (config, metrics, samples, checkpoints). auto: a new one, "
        "runs/NAME-YYYYMMDD-HHMMSS with NAME the config file's name (the method's without a file), "
        "so that a run never lands in an earlier run's directory; the run prints it.",
    )
    save_every: int = option(0, "Checkpoint every N steps (0: only at the end).", valid=NON_NEGATIVE)
    keep_last: int = option(2, "Checkpoints kept; older ones are deleted.", valid=AT_LEAST_1)
    eval_every: int = option(
        0, "Evaluate on data.eval every N steps (0: only before and after).", valid=NON_NEGATIVE
    )
    eval_samples: int = option(8, "Samples per held-out problem for mean@k / pass@k.", valid=AT_LEAST_1)
    eval_base: bool = option(
        True,
        "Evaluate the model before any update (step 0). A comparison of two trained variants on the "
        "same seed does not read it: false saves a study that evaluation (docs/evaluation.md, "
        "'What to evaluate').",
    )
    eval_base_problems: int | None = option(
        None,
        "Problems of each split in the step-0 evaluation: the first N of the held-out (and transfer) "
        "problems; null: all. 'semrl compare' labels a base row over fewer problems than the final one.",
        valid=AT_LEAST_1,
    )
    eval_temperature: float | None = option(
        None,
        "Evaluation temperature (null: the training temperature).",
        valid=NON_NEGATIVE,
    )
    eval_cache: str | None = option(
        None,
        "Directory where the step-0 evaluation (the model before any update) is stored and reused by "
        "runs that would sample it identically: same model, dtype, engine, problems, sampling "
        "settings, samples and seed. 'semrl sweep' sets it, so that a study evaluates its base model "
        "once per seed instead of once per run. null: no reuse.",
    )
    samples_per_step: int = option(4, "Completions written to samples.jsonl per step.", valid=NON_NEGATIVE)
    trees_per_step: int = option(
        2,
        "Rollout trees (ROSE) written to trees.jsonl per step for the report's tree viewer; 0: none.",
        valid=NON_NEGATIVE,
    )
    report_to: list[str] = option(
        ["tensorboard"],
        "Experiment trackers receiving every step's metrics, the resolved config and sample completions: "
        "tensorboard (RUN_DIR/tensorboard), wandb, trackio, mlflow (each an extra: pip install "
        "'semrl[wandb]'); [] for none. Where they write is their own setting: WANDB_MODE=offline, "
        "TRACKIO_DIR, MLFLOW_TRACKING_URI. Replaces logging.tensorboard.",
    )
    project: str = option("semrl", "W&B / Trackio project and MLflow experiment of the run.")
    run_name: str | None = option(None, "The run's name in the trackers (null: the run directory's name).")
    log_ref_kl: bool = option(
        False, "Load the reference model to log the KL to it even when algorithm.kl_coef = 0."
    )
    low_entropy_threshold: float = option(
        0.1,
        "Tokens with entropy below this (nats) count as low-entropy in entropy/low_frac.",
        valid=NON_NEGATIVE,
    )
    progress: bool = option(True, "Show a live progress bar.")
