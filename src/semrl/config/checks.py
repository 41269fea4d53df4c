"""A checked config from raw values, and the checks across the trainer's sections that a field's
type and range cannot express."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from semrl.config.learning_sections import check_trackers
from semrl.config.options import (
    build_section,
    check_ranges,
    unknown_key,
)
from semrl.config.sections import Config, core_sections
from semrl.errors import ConfigError

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
    # group_size < 2 and temperature 0 are refused, with their reasons, by their ranges; checked here
    # too for a Config built in Python (dataclasses.replace), which no YAML reading checked
    check_ranges(r, "rollout")
    if r.top_k == 1:
        raise ConfigError(
            "config key 'rollout.top_k' is 1: only the most likely token can be sampled, so the G "
            "responses to a prompt are the same text, every advantage is 0 and nothing is learned; "
            "use rollout.top_k=0 (off) or >= 2"
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
