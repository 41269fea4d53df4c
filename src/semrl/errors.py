"""Errors that stop a run with a message saying what to do (config and data errors live beside
their parsers: ``semrl.config.ConfigError``, ``semrl.data.DataError``)."""

from __future__ import annotations


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. too many non-finite updates); the message says what to do."""


class EngineError(ValueError):
    """The sampling engine cannot start with these settings (vLLM missing, a model it cannot
    load, a KV cache too small); the message names the setting to change."""
