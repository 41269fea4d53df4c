"""Final-answer extraction from model output. Pure string code: nothing is ever evaluated."""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _balanced_group(text: str, open_idx: int) -> str | None:
    """Content of the ``{...}`` group opening at ``text[open_idx]``; ``\\{``/``\\}`` are literal."""
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # skip the escaped character, e.g. \{ or \}
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_idx + 1 : i]
        i += 1
    return None  # unbalanced


def extract_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``)."""
    best_pos, best = -1, None
    for cmd in _BOX_COMMANDS:
        start = 0
        while True:
            pos = text.find(cmd, start)
            if pos < 0:
                break
            start = pos + len(cmd)
            j = start
            while j < len(text) and text[j] == " ":
                j += 1
            content: str | None
            if j < len(text) and text[j] == "{":
                content = _balanced_group(text, j)
            elif j > start and j < len(text):  # "\boxed 5": one token after a space
                m = re.match(r"[^\s$]+", text[j:])
                content = m.group(0) if m else None
            else:
                content = None
            if content is not None and pos > best_pos:
                best_pos, best = pos, content
    return best.strip() if best is not None else None


def extract_last_number(text: str) -> str | None:
    """The last number in ``text`` (integers, decimals, simple fractions), commas removed."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    return matches[-1].replace(",", "").rstrip(".")


def extract_answer(text: str, final_number_fallback: bool) -> str | None:
    """Last boxed answer, else (if enabled) the last number, else None."""
    answer = extract_boxed(text)
    if answer is None and final_number_fallback:
        answer = extract_last_number(text)
    return answer
