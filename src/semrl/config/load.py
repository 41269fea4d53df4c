"""Loading a run config: one YAML file plus dotted command-line overrides, checked before any
model loads.

``semrl.config.sections`` holds the sections as data and ``semrl.config.checks`` checks them; this
module adds what the methods know. The method named by ``algorithm.method`` (for LATR, the host it
names) fills the algorithm keys left null with its defaults, every registered method's section is
built from its option class, and the method's own checks run
(``semrl.methods.registry.MethodSpec.check``). Unknown keys and wrong types fail with the name of
the key and the closest valid one. A loaded config is final: frozen, defaults filled in.

The trainer's sections are checked first, before the methods (and torch with them) are imported,
so that most config errors answer at once (``benchmarks/bench_startup.py``).
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semrl.config.checks import build_config, check_trainer_sections
from semrl.config.engine_checks import check_vllm_settings
from semrl.config.files import config_file, read_values
from semrl.config.options import section_options, section_reference
from semrl.config.sections import AlgorithmConfig, Config, LoggingConfig, core_sections
from semrl.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from semrl.methods.registry import PolicyLoss

__all__ = [
    "config_from_dict",
    "config_reference",
    "fresh_run_dir",
    "load_config",
    "method_sections",
    "methods_table",
    "validate",
]


def method_sections() -> dict[str, type]:
    """Every registered method's option class by its section name."""
    from semrl.methods.catalog import METHODS

    return {name: spec.options for name, spec in METHODS.items() if spec.options is not None}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML file (optional), apply ``section.key=value`` overrides, validate. A run
    directory left ``auto`` becomes a new one named after the file (``fresh_run_dir``)."""
    name = config_file(path).stem if path is not None else None
    return config_from_dict(read_values(path, overrides), name)


def config_from_dict(values: dict[str, Any], name: str | None = None) -> Config:
    """A final config from nested values: the method's defaults fill the algorithm keys left null,
    and ``logging.output_dir: auto`` becomes ``fresh_run_dir(name)`` (``name`` None: the method's)."""
    if not isinstance(values, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {values!r}")
    check_trainer_sections(values)
    method = _method_name(values)
    logging_values = values.get("logging") or {}
    if logging_values.get("output_dir", LoggingConfig.output_dir) == "auto":
        values = {**values, "logging": {**logging_values, "output_dir": fresh_run_dir(name or method)}}
    from semrl.methods.catalog import get_method

    spec = get_method(method)
    if spec.host is not None:  # LATR trains with its host method's loss and advantage defaults
        spec = get_method(spec.host(values.get(spec.name)))
    algorithm = dict(values.get("algorithm") or {})
    for key, default in (
        ("norm_adv_by_std", spec.norm_adv_by_std),
        ("loss_agg_mode", spec.loss_agg_mode),
        ("policy_loss", spec.policy_loss),
        ("clip_ratio_low", spec.clip_ratio_low),
        ("clip_ratio_high", spec.clip_ratio_high),
    ):
        if algorithm.get(key) is None:
            algorithm[key] = default
    cfg = build_config({**values, "algorithm": algorithm}, method_sections())
    validate(cfg)
    return cfg


def fresh_run_dir(name: str, root: Path = Path("runs"), now: datetime | None = None) -> str:
    """``root/NAME-YYYYMMDD-HHMMSS`` (local time), with ``-2``, ``-3``... when that exists already:
    a run directory of its own for every run started, as TRL's and verl's time-stamped defaults
    give. Nothing is created here; the trainer creates it."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    run_dir, n = root / f"{name}-{stamp}", 2
    while run_dir.exists():
        run_dir, n = root / f"{name}-{stamp}-{n}", n + 1
    return str(run_dir)


def _method_name(values: dict[str, Any]) -> str:
    """The registered method the raw config values select; an unknown one fails with the registry's
    message (the closest name, the available ones), under the config key."""
    from semrl.methods.catalog import METHODS

    algorithm = values.get("algorithm") or {}
    name = algorithm.get("method", AlgorithmConfig.method) if isinstance(algorithm, dict) else None
    if isinstance(name, str) and name in METHODS:
        return name
    try:
        METHODS.get(str(name))
    except KeyError as err:
        raise ConfigError(f"config key 'algorithm.method': {err.args[0]}") from None
    raise ConfigError(f"config key 'algorithm.method' must be a method's name, got {name!r}")


def validate(cfg: Config) -> None:
    """The checks that need more than the config's own fields: the policy loss is registered, the
    engine's settings, the method's own checks, and what FSDP with vllm cannot do."""
    from semrl.methods.catalog import POLICY_LOSSES, get_method

    if cfg.algorithm.policy_loss not in POLICY_LOSSES:
        raise ConfigError(
            f"config key 'algorithm.policy_loss': unknown loss '{cfg.algorithm.policy_loss}'. "
            f"Available: {', '.join(sorted(POLICY_LOSSES))}"
        )
    if cfg.rollout.engine == "vllm":
        check_vllm_settings(cfg)
    spec = get_method(cfg.algorithm.method)
    if spec.check is not None:
        spec.check(cfg)
    entropy_setting = None
    if spec.needs_entropy and spec.section:
        entropy_setting = spec.needs_entropy(cfg.section(spec.name))
    _warn_inert_terms(cfg, POLICY_LOSSES[cfg.algorithm.policy_loss])
    # the forward would need the full weights, which FSDP keeps only sharded; vLLM's sampler records
    # the entropy without it (rollout.vllm_sampler_entropy)
    sampler_entropy = cfg.rollout.vllm_sampler_entropy
    if cfg.trainer.fsdp and cfg.rollout.engine == "vllm" and entropy_setting and not sampler_entropy:
        raise ConfigError(
            f"with trainer.fsdp and rollout.engine=vllm the rollout cannot run a forward pass for entropies "
            f"({entropy_setting}) and rollout.vllm_sampler_entropy=false turns off the sampler's own record; "
            "set rollout.vllm_sampler_entropy=true, change that option or use rollout.engine=hf"
        )


def purely_on_policy(cfg: Config) -> bool:
    """Whether every optimizer step sees old log-probs equal to the current ones: one epoch over the
    rollout batch in one mini-batch, so that ratios are exactly 1 (docs/algorithms.md "Old log-probs")."""
    batch = cfg.rollout.group_size * cfg.rollout.prompts_per_step
    one_mini_batch = cfg.trainer.mini_batch_size is None or cfg.trainer.mini_batch_size >= batch
    return cfg.trainer.ppo_epochs == 1 and one_mini_batch


def _warn_inert_terms(cfg: Config, loss: PolicyLoss) -> None:
    """Options that silently do nothing under this update schedule, said loudly when the config
    loads: a term of the policy loss that only acts off-policy, and clip-higher (a clip range is
    never reached at ratio 1)."""
    if not purely_on_policy(cfg):
        return
    inert = []
    if loss.section is not None and (term := loss.off_policy_term(cfg.section(loss.section))):
        inert.append(term)
    a = cfg.algorithm
    if a.policy_loss == "ppo" and a.clip_ratio_high != a.clip_ratio_low:
        inert.append(f"clip-higher (algorithm.clip_ratio_high={a.clip_ratio_high})")
    if inert:
        logging.getLogger("semrl").warning(
            "%s has no effect: the update is purely on-policy (trainer.ppo_epochs=1 and one mini-batch), "
            "so old log-probs equal the current ones and every ratio is exactly 1. To make it act, set "
            "trainer.mini_batch_size below the rollout batch of %d sequences or trainer.ppo_epochs > 1 "
            "(docs/troubleshooting.md, 'Configs that cannot learn')",
            " and ".join(inert),
            cfg.rollout.group_size * cfg.rollout.prompts_per_step,
        )


def methods_table() -> str:
    """Markdown table of the registered methods, their defaults and where their options are."""
    from semrl.methods.catalog import METHODS

    lines = ["| method | loss aggregation, policy loss | options | what it is |", "|---|---|---|---|"]
    for name, spec in sorted(METHODS.items()):
        section = f"`{name}.*`" if spec.options is not None else "-"
        defaults = f"{spec.loss_agg_mode}, loss `{spec.policy_loss}`"
        description = spec.description.replace("|", "\\|")
        lines.append(f"| `{name}` | {defaults} | {section} | {description} |")
    return "\n".join(lines)


SECTION_SUMMARIES = {
    "model": "The model trained and sampled: which one, its precision, LoRA.",
    "data": "Training, held-out and transfer problems, the prompt, the curriculum.",
    "rollout": "Sampling: group size, prompts per step, length, temperature, the engine.",
    "reward": "Reward functions, their weights and the verifier's time limit.",
    "algorithm": "The method and what every method shares: advantages, the loss, KL, dynamic sampling.",
    "trainer": "Optimisation: steps, learning rate, batches, epochs, processes, FSDP.",
    "logging": "Output directory, checkpoints, evaluation during training, trackers.",
}


def _sections(names: list[str] | None) -> list[tuple[str, type]]:
    """(name, options class) of every section, or of ``names`` (checked, with did-you-mean)."""
    every = [*core_sections().items(), *sorted(method_sections().items())]
    if not names:
        return every
    known = [name for name, _ in every]
    for name in names:
        if name not in known:
            extra = did_you_mean(name, known)
            raise ConfigError(f"no config section '{name}'.{extra} The sections: {', '.join(known)}")
    return [(name, cls) for name, cls in every if name in names]


def _summary(name: str) -> str:
    if name in SECTION_SUMMARIES:
        return SECTION_SUMMARIES[name]
    from semrl.methods.catalog import METHODS

    return f"Options of `algorithm.method={name}`: {METHODS[name].description}"


def config_reference(sections: list[str] | None = None, width: int | None = None) -> str:
    """Every option (of ``sections``; all by default), its type, default and meaning, section by
    section; then the methods. ``width`` None: Markdown, a table per section (the docs' config
    reference); a terminal's width: plain text wrapped to it."""
    import functools
    import textwrap

    chosen = _sections(sections)
    if width is None:
        parts = []
        for name, cls in chosen:
            table = ["| key | type | default | meaning |", "|---|---|---|---|", *section_reference(name, cls)]
            parts += [f"### `{name}`", _summary(name), "\n".join(table)]
        methods = "" if sections else "\n\n### Methods (`algorithm.method`)\n\n" + methods_table()
        return "\n\n".join(parts) + methods
    lines = []
    for name, cls in chosen:
        lines += [name.upper(), *textwrap.wrap(_summary(name).replace("`", ""), width), ""]
        for key, tp, default, meaning in section_options(name, cls):
            wrap = functools.partial(textwrap.wrap, width=width, subsequent_indent=" " * 6)
            lines += wrap(f"{key} = {default}  ({tp.replace('|', 'or')})", initial_indent="  ")
            lines += wrap(meaning, initial_indent=" " * 6)
        lines.append("")
    return "\n".join(lines).rstrip()
