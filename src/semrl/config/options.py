"""Typed option sections: the machinery behind every config section, the trainer's and the methods'.

A section is a frozen dataclass whose fields are declared with ``option`` (a default and a help
text, written once). ``build_section`` turns a mapping read from YAML into a section, checking
each value against its annotation and naming the key and the closest valid one on a mistake. A
section may check relations between its own fields in ``__post_init__`` (raise ``ConfigError``).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
import warnings
from collections.abc import Callable
from dataclasses import field
from typing import Any, Literal, cast

from semrl.errors import ConfigError, did_you_mean


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric option takes: ``low`` / ``high`` bounds (None: unbounded), each closed
    unless marked open. Lists are checked item by item; None (an unset optional) is not checked."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""  # said after the bounds when a value is refused

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.low is None and self.high is None:
            return "a finite number"
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{self.low:g}, {self.high:g}{right}"


FINITE = Range()  # any real number: weights, bounds of a covariance
POSITIVE = Range(0, None, low_open=True)  # > 0: learning rates, time limits, scales
AT_LEAST_1 = Range(1)  # sizes and counts
NON_NEGATIVE = Range(0)  # coefficients, steps, temperatures
FRACTION = Range(0, 1)  # probabilities and shares, [0, 1]
OPEN_FRACTION = Range(0, 1, low_open=True)  # (0, 1]: top-p


def option(
    default: Any, help: str, *, valid: Range | None = None, formerly: str | None = None, **kw: Any
) -> Any:
    """A section field with its default and its one documentation text (``semrl config`` prints it);
    ``valid``: the range a number must lie in, checked when the section is built; ``formerly``: the
    key's old name, still read (configs and saved runs that use it load, with a warning)."""
    metadata = {"help": help, "range": valid, "formerly": formerly}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


def check_range(key: str, value: Any, valid: Range | None) -> None:
    """Raise a ConfigError naming ``key`` when a number (or a list item) lies outside ``valid``."""
    if valid is None or value is None:
        return
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, (int, float)) and not isinstance(item, bool) and not valid.holds(item):
            why = f": {valid.why}" if valid.why else ""
            raise ConfigError(f"config key '{key}' must be {valid}, got {item!r}{why}")


def type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


# a scalar annotation -> (does a value fit it, what the error says was expected)
_SCALARS: dict[type, tuple[Callable[[Any], bool], str]] = {
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    str: (lambda v: isinstance(v, str), "a string"),
}


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted for floats, lists for tuples."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, tp, key)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            extra = did_you_mean(str(value), [str(c) for c in choices])
            raise ConfigError(f"config key '{key}': {value!r} is not one of {list(choices)}.{extra}")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
        return [coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp not in _SCALARS:
        raise ConfigError(f"config key '{key}': unsupported type {tp}")  # pragma: no cover
    fits, expected = _SCALARS[tp]
    if not fits(value):
        raise ConfigError(f"config key '{key}': expected {expected}, got {value!r}")
    return float(value) if tp is float else value


def _coerce_union(value: Any, tp: Any, key: str) -> Any:
    """``value`` as the first member of the union ``tp`` it fits (None for an optional one)."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    others = [a for a in args if a is not type(None)]
    if len(others) == 1:  # an optional value: the error names what it may be
        return coerce(value, others[0], key)
    for arg in others:
        try:
            return coerce(value, arg, key)
        except ConfigError:
            pass
    raise ConfigError(f"config key '{key}': {value!r} is not a valid {type_name(tp)}")


def unknown_key(key: str, valid: list[str], prefix: str) -> ConfigError:
    extra = did_you_mean(key, valid, cutoff=0.5, prefix=prefix)
    return ConfigError(f"unknown config key '{prefix}{key}'.{extra} Valid keys here: {', '.join(valid)}")


def build_section(cls: type, values: Any, prefix: str) -> Any:
    """The section ``cls`` from a mapping of its keys (missing keys keep their defaults).

    ``prefix`` is the section's dotted name with a trailing dot, used in error messages.
    """
    if not isinstance(values, dict):
        raise ConfigError(f"config key '{prefix.rstrip('.')}' must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = _renamed(values, fields, prefix)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise unknown_key(key, list(fields), prefix)
        kwargs[key] = coerce(value, hints[key], f"{prefix}{key}")
        check_range(f"{prefix}{key}", kwargs[key], fields[key].metadata.get("range"))
    return cls(**kwargs)


def _renamed(
    values: dict[str, Any], fields: dict[str, dataclasses.Field[Any]], prefix: str
) -> dict[str, Any]:
    """``values`` with each option's old name (``option(formerly=...)``) read as its new one, with a
    ``FutureWarning``; both names at once is an error, since one would silently win."""
    renamed = {f.metadata["formerly"]: name for name, f in fields.items() if f.metadata.get("formerly")}
    if not renamed.keys() & values.keys():
        return values
    values = dict(values)
    for old, new in renamed.items():
        if old not in values:
            continue
        if new in values:
            raise ConfigError(
                f"config keys '{prefix}{old}' and '{prefix}{new}' are the same option (renamed); keep "
                f"'{prefix}{new}' only"
            )
        values[new] = values.pop(old)
        message = f"config key '{prefix}{old}' is now '{prefix}{new}'; the old name is still read"
        warnings.warn(message, FutureWarning, stacklevel=2)
    return values


def reference_type(tp: Any) -> str:
    """An annotation as the config reference writes it: a Literal's allowed values, "X or None"."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        parts = [a for a in typing.get_args(tp) if a is not type(None)]
        named = " or ".join(reference_type(a) for a in parts)
        return named + " or None" if len(parts) < len(typing.get_args(tp)) else named
    if origin in (list, tuple):
        return cast("str", origin.__name__)
    return type_name(tp)


def section_options(name: str, cls: type) -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) of every option of one section, as plain text."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        # a field without a default has a default_factory, which the checker cannot know
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
        meaning = f.metadata.get("help", "")
        if f.metadata.get("range") is not None:
            meaning += f" Must be {f.metadata['range']}."
        if f.metadata.get("formerly"):
            meaning += f" Formerly `{name}.{f.metadata['formerly']}`, which is still read."
        rows.append((f"{name}.{f.name}", reference_type(hints[f.name]), repr(default), meaning))
    return rows


def section_reference(name: str, cls: type) -> list[str]:
    """Markdown table rows (key, type, default, meaning) of one section."""
    rows = []
    for key, tp, default, meaning in section_options(name, cls):
        escaped = meaning.replace("|", "\\|")  # a bar inside a Markdown table cell
        rows.append(f"| `{key}` | {tp.replace('|', 'or')} | `{default}` | {escaped} |")
    return rows


def check_ranges(section: Any, name: str) -> None:
    """Every field of the options ``section`` (a dataclass instance) within its declared range: the
    method option classes call it from ``__post_init__``, so that an option constructed in Python
    is held to the ranges a loaded config is (``name``: the section's name in messages)."""
    for f in dataclasses.fields(section):
        check_range(f"{name}.{f.name}", getattr(section, f.name), f.metadata.get("range"))
