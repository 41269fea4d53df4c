"""Behaviour tests for every config range, written out value by value.

tests/config/test_config.py derives its out-of-range values from each option's declared ``Range``, so a
declaration changed to the wrong range still passes there; only the generated config reference would
change. Here every range is pinned by literal values: each refused value stops ``semrl train``
before a model loads (exit 2, the key named, no run directory), and each accepted value at the edge
loads. An option added with a range must be added here too.
"""

from __future__ import annotations

import dataclasses

import pytest

from semrl.cli import main
from semrl.config.load import load_config, method_sections
from semrl.config.sections import core_sections

CORE = {"model", "data", "rollout", "reward", "algorithm", "trainer", "logging"}

# (key, values refused, values accepted at the edge of the range)
PINNED = [
    ("model.lora_r", ["-1"], ["0"]),
    ("model.lora_alpha", ["0"], ["0.001"]),
    ("model.lora_dropout", ["-0.001", "1"], ["0", "0.999"]),
    ("data.eval_size", ["0"], ["1"]),
    ("data.transfer_levels", ["[0]", "[6]"], ["[1]", "[5]"]),
    ("data.arithmetic_levels", ["[0]", "[6]"], ["[1]", "[5]"]),
    ("data.arithmetic_size", ["0"], ["1"]),
    ("data.max_prompt_length", ["0"], ["1"]),
    ("data.curriculum_stages", ["0"], ["1"]),
    ("rollout.group_size", ["1"], ["2"]),
    ("rollout.prompts_per_step", ["0"], ["1"]),
    ("rollout.max_new_tokens", ["0"], ["1"]),
    ("rollout.temperature", ["0"], ["0.001"]),
    ("rollout.top_p", ["0", "1.001"], ["0.001", "1"]),
    ("rollout.top_k", ["-1"], ["0"]),
    ("rollout.generation_batch_size", ["0"], ["1"]),
    ("rollout.logprobs_top_k", ["-1"], ["0"]),
    ("rollout.vllm_kv_cache_gib", ["0"], ["0.001"]),
    ("rollout.vllm_gpu_memory_utilization", ["0", "1.001"], ["0.001", "1"]),
    ("rollout.vllm_block_size", ["0"], ["1"]),
    ("rollout.vllm_max_num_seqs", ["0"], ["1"]),
    ("rollout.vllm_max_num_batched_tokens", ["0"], ["1"]),
    ("reward.weights", ["[.inf]"], ["[-1.5]"]),
    ("reward.timeout_s", ["0"], ["0.001"]),
    ("reward.wall_timeout_s", ["0"], ["0.001"]),
    ("reward.max_error_rate", ["-0.001", "1.001"], ["0", "1"]),
    ("rollout.stall_timeout_s", ["0"], ["0.001"]),
    ("reward.num_workers", ["0"], ["1"]),
    ("reward.truncated_reward", [".inf"], ["-1.5"]),
    ("reward.overlong_buffer_len", ["-1"], ["0"]),
    ("reward.overlong_penalty_factor", ["-0.001"], ["0"]),
    ("algorithm.clip_ratio_low", ["-0.001", "1.001"], ["0", "1"]),
    ("algorithm.clip_ratio_high", ["-0.001"], ["0"]),
    ("algorithm.clip_ratio_c", ["1"], ["1.001"]),
    ("algorithm.kl_coef", ["-0.001"], ["0"]),
    ("algorithm.max_sampling_rounds", ["0"], ["1"]),
    ("algorithm.entropy_coeff", ["-0.001"], ["0"]),
    ("algorithm.entropy_target", ["-0.001"], ["0"]),
    ("algorithm.entropy_coeff_delta", ["-0.001"], ["0"]),
    ("algorithm.entropy_coeff_min", ["-0.001"], ["0"]),
    ("algorithm.entropy_coeff_max", ["-0.001"], ["0"]),
    ("algorithm.rollout_is_cap", ["0"], ["0.001"]),
    ("trainer.steps", ["-1"], ["0"]),
    ("trainer.lr", ["0"], ["0.001"]),
    ("trainer.weight_decay", ["-0.001"], ["0"]),
    ("trainer.betas", ["[-0.001]", "[1]"], ["[0]", "[0.999]"]),
    ("trainer.warmup_steps", ["-1"], ["0"]),
    ("trainer.max_grad_norm", ["0"], ["0.001"]),
    ("trainer.ppo_epochs", ["0"], ["1"]),
    ("trainer.mini_batch_size", ["0"], ["1"]),
    ("trainer.micro_batch_size", ["0"], ["1"]),
    ("trainer.micro_batch_tokens", ["0"], ["1"]),
    ("trainer.logits_chunk_size", ["0"], ["1"]),
    ("trainer.max_bad_updates", ["-1"], ["0"]),
    ("trainer.seed", ["-1"], ["0"]),
    ("trainer.num_threads", ["0"], ["1"]),
    ("logging.save_every", ["-1"], ["0"]),
    ("logging.keep_last", ["0"], ["1"]),
    ("logging.eval_every", ["-1"], ["0"]),
    ("logging.eval_samples", ["0"], ["1"]),
    ("logging.eval_base_problems", ["0"], ["1"]),
    ("logging.eval_temperature", ["-0.001"], ["0"]),
    ("logging.samples_per_step", ["-1"], ["0"]),
    ("logging.trees_per_step", ["-1"], ["0"]),
    ("logging.low_entropy_threshold", ["-0.001"], ["0"]),
    ("clip_cov.ratio", ["0", "1.001"], ["0.001", "1"]),
    ("clip_cov.lb", [".inf"], ["-1.5"]),
    ("clip_cov.ub", [".inf"], ["-1.5"]),
    ("entropy_8020.top_quantile", ["0", "1.001"], ["0.001", "1"]),
    ("fr3e.num_anchors", ["0"], ["1"]),
    ("kl_cov.ratio", ["0", "1.001"], ["0.001", "1"]),
    ("kl_cov.ppo_kl_coef", ["-0.001"], ["0"]),
    ("latr.tau_abs", ["-0.001", "1.001"], ["0", "1"]),
    ("latr.tau_rel", ["-0.001", "1.001"], ["0", "1"]),
    ("latr.edit_distance_threshold", ["-0.001", "1.001"], ["0", "1"]),
    ("latr.suffix_match_threshold", ["-0.001", "1.001"], ["0", "1"]),
    ("latr.rouge_l_threshold", ["-0.001", "1.001"], ["0", "1"]),
    ("latr.lookahead", ["[0]"], ["[1]"]),
    ("latr.eta_steps", ["[-1]"], ["[0]"]),
    ("latr.eta_values", ["[-0.001]", "[1.001]"], ["[0]", "[1]"]),
    ("latr.return_threshold", ["-0.001", "1.001"], ["0", "1"]),
    ("latr.return_threshold_decay", ["-0.001", "1.001"], ["0", "1"]),
    ("latr.force_return_step", ["-1"], ["0"]),
    ("rose.epsilon", ["-0.001", "1.001"], ["0", "1"]),
    ("rose.alpha", ["-0.001"], ["0"]),
    ("rose.sd_top_k", ["0"], ["1"]),
    ("seed_grpo.alpha", ["-0.001"], ["0"]),
    ("sent.entropy_quantile", ["0", "1.001"], ["0.001", "1"]),
    ("sent.cov_top_ratio", ["0", "1.001"], ["0.001", "1"]),
    ("sent.beta_high", ["-0.001"], ["0"]),
    ("sent.beta_low", ["-0.001"], ["0"]),
    ("treepo.segment_length", ["0"], ["1"]),
    ("treepo.max_depth", ["0"], ["1"]),
    ("treepo.branch", ["0"], ["1"]),
    ("treepo.first_branch_max", ["-1"], ["0"]),
    ("treepo.repetition_window", ["0"], ["1"]),
    ("treepo.repetition_count", ["0"], ["1"]),
]


def _ranged_keys() -> set[str]:
    sections = [*core_sections().items(), *method_sections().items()]
    return {
        f"{s}.{f.name}" for s, cls in sections for f in dataclasses.fields(cls) if f.metadata.get("range")
    }


def test_every_ranged_option_is_pinned():
    assert {key for key, _, _ in PINNED} == _ranged_keys()


# a method's other options that the default rollout (64 new tokens) needs
METHOD_BASE = {"treepo": ["treepo.segment_length=16"]}


def _method(key: str) -> list[str]:
    section = key.split(".")[0]
    return [] if section in CORE else [f"algorithm.method={section}", *METHOD_BASE.get(section, [])]


@pytest.mark.parametrize(("key", "refused", "accepted"), PINNED, ids=[p[0] for p in PINNED])
def test_a_value_out_of_range_stops_training_before_a_model_loads(key, refused, accepted, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(f"logging:\n  output_dir: {tmp_path / 'run'}\n")
    # a model that does not exist: should a range check go missing, the run fails fast on it instead
    no_model = f"model.name={tmp_path / 'no-model'}"
    for value in refused:
        assert main(["train", "--config", str(config), no_model, *_method(key), f"{key}={value}"]) == 2, value
        err = capsys.readouterr().err
        assert f"config key '{key}' must be" in err, err
        assert not (tmp_path / "run").exists()
    for value in accepted:
        load_config(config, [*_method(key), f"{key}={value}"])
