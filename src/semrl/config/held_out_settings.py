"""The settings that decide a held-out evaluation, in one list for the two places that read them: the
held-out cache key (``semrl.evaluation.held_out.evaluation_key``: runs with equal keys sample the same
responses) and ``semrl compare``'s check that runs were evaluated alike
(``semrl.studies.evaluation_match``). Torch-free: compare reads run directories without a model."""

from __future__ import annotations

from typing import Any

# (cache-key field, section, key): how held-out samples are drawn and judged. Runs that differ here
# were not evaluated alike, and semrl compare refuses to set their held-out numbers side by side.
HOW_SAMPLED_AND_JUDGED: tuple[tuple[str, str, str], ...] = (
    ("temperature", "logging", "eval_temperature"),
    ("rollout_temperature", "rollout", "temperature"),  # the held-out temperature where the above is null
    ("top_p", "rollout", "top_p"),
    ("top_k", "rollout", "top_k"),
    ("max_new_tokens", "rollout", "max_new_tokens"),
    ("samples", "logging", "eval_samples"),
    ("system_prompt", "data", "system_prompt"),
    ("prompt_template", "data", "prompt_template"),
    ("final_number_fallback", "reward", "final_number_fallback"),
    ("reward_functions", "reward", "functions"),
    ("reward_weights", "reward", "weights"),
    ("correctness", "reward", "correctness"),
    ("reward_timeout_s", "reward", "timeout_s"),
    ("numeral_answers", "reward", "numeral_answers"),
    ("refuse_restatements", "reward", "refuse_restatements"),
)
# (cache-key field, section, key): the model and the machinery that samples it. Compared runs differ
# here by design (other weights, another seed, another engine); the dtype has its own note in compare.
WHAT_SAMPLES: tuple[tuple[str, str, str], ...] = (
    ("model", "model", "name"),
    ("dtype", "model", "dtype"),
    ("master_weights", "model", "master_weights"),
    ("lora_r", "model", "lora_r"),
    ("attn_implementation", "model", "attn_implementation"),
    ("engine", "rollout", "engine"),
    ("generation_batch_size", "rollout", "generation_batch_size"),
    ("vllm_block_size", "rollout", "vllm_block_size"),
    ("vllm_dtype", "rollout", "vllm_dtype"),
    ("vllm_max_num_seqs", "rollout", "vllm_max_num_seqs"),
    ("vllm_max_num_batched_tokens", "rollout", "vllm_max_num_batched_tokens"),
    ("seed", "trainer", "seed"),
)
# (section, key): which problems are held out; the cache key holds the problems themselves instead
WHICH_PROBLEMS: tuple[tuple[str, str], ...] = (
    ("data", "eval"),
    ("data", "eval_size"),
    ("data", "eval_split"),
    ("data", "problem_key"),
    ("data", "answer_key"),
)
# 'auto' held-out problems come from data.train: then the training data decides them too
HELD_OUT_FROM_TRAIN: tuple[tuple[str, str], ...] = (("data", "train"), ("data", "arithmetic_levels"))


def setting(config: Any, section: str, key: str) -> Any:
    """``section.key`` of ``config``: a Config, or a run's config.yaml as a dict."""
    if isinstance(config, dict):
        return config.get(section, {}).get(key)
    return getattr(getattr(config, section), key)


def decides_held_out(config: Any, section: str, key: str) -> bool:
    """Whether ``section.key`` decides ``config``'s held-out samples: all the listed settings do,
    except ``rollout.temperature`` where ``logging.eval_temperature`` is set."""
    if (section, key) == ("rollout", "temperature"):
        return setting(config, "logging", "eval_temperature") is None
    return True
