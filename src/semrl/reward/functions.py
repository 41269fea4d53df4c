"""Reward functions: built-in checks and the user's own, TRL-style or verl-style.

``reward.functions`` names one or more functions, each with a weight (``reward.weights``); the
reward of a completion is the weighted sum of their scores. A name is a built-in check (``math``,
``boxed_match``, ``final_number``), ``package.module:function`` or ``path/to/file.py:function``.

A user function takes TRL's arguments and returns one score per completion, a float or None
(None counts as 0, as TRL sums rewards ignoring missing ones)::

    def my_reward(prompts, completions, completion_ids, **kwargs) -> list[float | None]

``kwargs`` holds the dataset's columns, one value per completion (``answer``, ``id``, ``solution``,
``level``, ``subject`` and any extra column). A function whose parameters are verl's
``compute_score(data_source, solution_str, ground_truth, extra_info)`` is called once per completion
through an adapter (a dict result gives its ``"score"``).

Every call scores one completion and runs in a worker process of the reward pool
(``semrl.reward.verify``), so a function that hangs is killed at ``reward.timeout_s``. A function that
raises or times out scores 0 on that completion; both are counted per function and the first
traceback of each is logged.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from semrl.errors import did_you_mean
from semrl.reward.extract import as_number, extract_boxed, extract_last_number, normalize_answer

BUILTIN = ("math", "boxed_match", "final_number")
CORRECTNESS_CHECKS = BUILTIN  # the first of these in the list decides ``correct``


class RewardFunctionError(ValueError):
    """A reward function that cannot be used; raised before training starts."""


def boxed_match(prompts: list[str], completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
    """The official ROSE code's check: 1 if the last ``\\boxed{}`` content equals the answer as a
    string (spaces removed), else 0."""
    out = []
    for completion, gold in zip(completions, answer, strict=True):
        boxed = extract_boxed(completion)
        out.append(float(boxed is not None and boxed.replace(" ", "") == str(gold).replace(" ", "")))
    return out


def final_number(prompts: list[str], completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
    """1 if the last number in the completion equals the answer as a number (fractions exact), else 0."""
    out = []
    for completion, gold in zip(completions, answer, strict=True):
        number, expected = extract_last_number(completion), as_number(normalize_answer(str(gold)))
        out.append(float(number is not None and expected is not None and as_number(number) == expected))
    return out


_BUILTIN_FUNCTIONS: dict[str, Callable[..., list[float]]] = {
    "boxed_match": boxed_match,
    "final_number": final_number,
}


def load_function(name: str) -> Callable[..., Any]:
    """The callable ``name`` refers to (built-ins other than ``math``, module or file paths)."""
    if name in _BUILTIN_FUNCTIONS:
        return _BUILTIN_FUNCTIONS[name]
    if ":" not in name:
        raise RewardFunctionError(
            f"reward function '{name}': expected a built-in ({', '.join(BUILTIN)}), "
            "'package.module:function' or 'path/to/file.py:function'." + did_you_mean(name, BUILTIN)
        )
    where, attr = name.rsplit(":", 1)
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise RewardFunctionError(f"reward function '{name}': file {path} does not exist")
        module_name = f"semrl_reward_{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except SyntaxError as err:  # where, and the line, as Python shows them
            line = (err.text or "").strip()
            raise RewardFunctionError(
                f"reward function '{name}': {path}, line {err.lineno}: {err.msg}\n    {line}"
            ) from err
        except Exception as err:
            raise RewardFunctionError(
                f"reward function '{name}': importing {path} failed: {type(err).__name__}: {err}"
            ) from err
    else:
        try:
            module = importlib.import_module(where)
        except Exception as err:
            raise RewardFunctionError(
                f"reward function '{name}': cannot import module '{where}' ({err!r}); install it or give a "
                "file path 'path/to/file.py:function'"
            ) from err
    function = getattr(module, attr, None)
    if not callable(function):
        defined = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise RewardFunctionError(
            f"reward function '{name}': '{where}' has no function '{attr}'."
            + did_you_mean(attr, defined, prefix=f"{where}:")
        )
    return cast("Callable[..., Any]", function)


def is_verl_style(function: Callable[..., Any]) -> bool:
    params = inspect.signature(function).parameters
    return "solution_str" in params and "ground_truth" in params


def check_signature(name: str, function: Callable[..., Any]) -> None:
    """Refuse a function that cannot be called the TRL or the verl way."""
    params = inspect.signature(function).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if is_verl_style(function):
        ok = {"data_source", "solution_str", "ground_truth", "extra_info"} <= set(params)
    else:
        ok = "completions" in params and ("prompts" in params or takes_all)
    if not ok:
        raise RewardFunctionError(
            f"reward function '{name}' has parameters ({', '.join(params)}); expected TRL's "
            "(prompts, completions, completion_ids, **kwargs) or verl's "
            "(data_source, solution_str, ground_truth, extra_info)"
        )


Scorer = Callable[[str, str, list[int], dict[str, Any]], float | None]


def scorer(function: Callable[..., Any]) -> Scorer:
    """``function`` as a scorer of one (prompt, completion, completion ids, dataset columns); its
    style, TRL or verl, is read once here."""
    if is_verl_style(function):

        def score_verl(
            prompt: str, completion: str, completion_ids: list[int], columns: dict[str, Any]
        ) -> float | None:
            extra = {k: v for k, v in columns.items() if k not in ("answer", "data_source")}
            score = function(
                data_source=columns.get("data_source", "semrl"),
                solution_str=completion,
                ground_truth=columns.get("answer"),
                extra_info=extra,
            )
            return _as_score(score["score"] if isinstance(score, dict) else score)

        return score_verl

    def score_trl(
        prompt: str, completion: str, completion_ids: list[int], columns: dict[str, Any]
    ) -> float | None:
        scores = function(
            prompts=[prompt],
            completions=[completion],
            completion_ids=[completion_ids],
            **{k: [v] for k, v in columns.items()},
        )
        if not isinstance(scores, list | tuple) or len(scores) != 1:
            raise TypeError(f"expected a list of 1 score for 1 completion, got {scores!r:.200}")
        return _as_score(scores[0])

    return score_trl


def _as_score(score: Any) -> float | None:
    return None if score is None else float(score)
