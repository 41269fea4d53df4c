"""The run configuration as data: ``Config``, the root holding every section.

The trainer's sections are declared by stage, each with its fields documented once in its help:
``model`` and ``data`` in ``input_sections``, ``rollout`` and ``reward`` in ``sampling_sections``,
``algorithm``, ``trainer`` and ``logging`` in ``learning_sections``; this module re-exports them. Each
method declares its own section in its module and registers it with the method
(``semrl.methods.registry``), e.g. ``rose.epsilon`` lives in ``semrl.methods.rose``. Nothing in
``semrl.config`` below ``load`` imports a method or torch: ``files`` reads raw values, ``checks``
builds and checks a config from them, and ``semrl.config.load`` asks the registry for the method's
section, defaults and checks. ``semrl config`` prints the whole reference.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from semrl.config.input_sections import DEFAULT_SYSTEM_PROMPT, DataConfig, ModelConfig
from semrl.config.learning_sections import AlgorithmConfig, LoggingConfig, TrainerConfig
from semrl.config.sampling_sections import RewardConfig, RolloutConfig
from semrl.errors import ConfigError

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "LoggingConfig",
    "ModelConfig",
    "RewardConfig",
    "RolloutConfig",
    "TrainerConfig",
    "core_sections",
]


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
