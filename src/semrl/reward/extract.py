"""Final-answer extraction from model output. Pure string code: nothing is ever evaluated."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import cast

_NUM = re.compile(r"^-?\d+(?:\.\d+)?(?:/\d+)?$")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _closing_braces(text: str) -> dict[int, int]:
    """Index of the ``}`` that closes each ``{`` that is closed, in one pass (``\\{``/``\\}`` are
    literal). One pass keeps extraction linear: scanning to the end once per ``\\boxed{`` is
    quadratic on an output of a million unclosed ``\\boxed{``."""
    closing: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # skip the escaped character, e.g. \{ or \}
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            closing[stack.pop()] = i
        i += 1
    return closing


_BOX = re.compile(r"\\(?:boxed|fbox)")
_BARE_TOKEN = re.compile(r"[^\s$]+")


def extract_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``)."""
    closing: dict[int, int] | None = None
    for match in reversed(list(_BOX.finditer(text))):
        start = j = match.end()
        while j < len(text) and text[j] == " ":
            j += 1
        if j < len(text) and text[j] == "{":
            if closing is None:
                closing = _closing_braces(text)
            if j in closing:
                return text[j + 1 : closing[j]].strip()
        elif start < j < len(text):  # "\boxed 5": one token after a space
            bare = _BARE_TOKEN.match(text, j)
            if bare:
                return bare.group(0).strip()
    return None


def extract_last_number(text: str) -> str | None:
    """The last number in ``text`` (integers, decimals, simple fractions), commas removed."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    return cast("str | None", matches[-1].replace(",", "").rstrip("."))


def extract_answer(text: str, final_number_fallback: bool) -> str | None:
    """Last boxed answer, else (if enabled) the last number, else None."""
    answer = extract_boxed(text)
    if answer is None and final_number_fallback:
        answer = extract_last_number(text)
    return answer


def normalize_answer(text: str) -> str:
    """Light, safe normalisation for the fast path (no parsing)."""
    s = text.strip().strip("$").strip()
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "\\displaystyle"):
        s = s.replace(token, "")
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s).rstrip(".")
    return s


def as_number(s: str) -> Fraction | None:
    s = s.replace(",", "")
    if not _NUM.match(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
