"""Whether an answer states a number or an expression that evaluates to one.

math-verify evaluates what it compares, so ``\\boxed{50+18}`` matches a gold of 68: a policy that
copies the question's arithmetic into the box is paid for it. Under ``reward.numeral_answers`` (the
default) an answer to a gold that is a plain number must itself be a numeral; the rule and its
reasons are in docs/rewards-and-data.md ("An answer must be an answer"). Pure string code: nothing is
ever evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from math import gcd

# An integer: plain digits (leading zeros allowed: AIME writes 068), or digits grouped by three with
# commas ("1,000", LaTeX "1{,}000") or spaces. ASCII digits only: re.ASCII keeps \d from matching
# Unicode digits, which no tokenizer's LaTeX answer uses and math-verify does not read.
_INTEGER = r"(?:\d{1,3}(?:(?:,|\{,\}| )\d{3})+|\d+)"
_DECIMAL = rf"(?:{_INTEGER}?\.\d+)"
_PLAIN = re.compile(rf"[+-]?(?:{_DECIMAL}|{_INTEGER})%?", re.ASCII)
# \frac{1}{2}, \frac12, \frac 1 2, \frac{1} {2}, \frac9{19}: each argument a braced integer or one digit
_FRAC_ARGUMENT = r"\s*(?:\{{\s*(?P<{0}>[+-]?\d+)\s*\}}|(?P<{0}_digit>\d))"
_FRACTIONS = (
    re.compile(
        rf"(?P<sign>[+-]?)\\frac{_FRAC_ARGUMENT.format('num')}{_FRAC_ARGUMENT.format('den')}%?", re.ASCII
    ),
    re.compile(r"(?P<sign>[+-]?)(?P<num>\d+)/(?P<den>\d+)%?", re.ASCII),
)
# A unit in \text{} (no digit in it), with an optional square or cube, is removed: "68 \text{ cm}^2".
_TEXT_COMMAND = r"\\(?:text|textrm|textbf|mbox|mathrm|mathbf)\s*"
_TEXT_UNIT = re.compile(_TEXT_COMMAND + r"\{[^{}0-9]*\}(?:\s*\^\s*\{?\s*[23]\s*\}?)?")
# Other \text{} is unwrapped to its content: a numeral in \text{68} is still 68.
_TEXT = re.compile(_TEXT_COMMAND + r"\{((?:[^{}]|\{[^{}]*\})*)\}")
# A unit in words after the number: "68 apples", "5 square feet"; one letter is a variable ("3 n" is 3n).
_UNIT_WORDS = re.compile(r"(?<=[\d%])\s+[A-Za-z]{2,}(?:\s+[A-Za-z]+)*\.?$")
_VARIABLE_IS = re.compile(r"\s*[A-Za-z](?:_\{?\w+\}?)?\s*=[^=]*$")  # "x = ...", "a_1 = ...": one variable
# Removed wherever they stand: LaTeX spacing, sizing, math-mode dollars, a currency sign, degrees.
_DECORATIONS = re.compile(
    r"\\left|\\right|\\displaystyle|\\[!,;: ]|~|\\\$|\$|\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°"
)


def numeral(text: str) -> str | None:
    """The numeral ``text`` states, with its decorations removed; None if it states anything else.

    A numeral is an optionally signed integer, decimal, or fraction of two integers in lowest terms
    with a denominator above 1 (``\\frac{1}{2}``, ``-3/7``), optionally followed by ``%``.
    Decorations are LaTeX spacing, ``$``, ``\\$``, degrees, a unit in words or in ``\\text{...}``
    (a ``\\text{}`` holding a digit is unwrapped instead), outer braces, outer parentheses that hold
    no comma (``(1,000)`` is a tuple), a final full stop, and anything up to the last ``=``
    (``x = 68`` states 68; ``68 = 50 + 18`` states 50 + 18). Sums, differences, products,
    quotients, powers, roots and scientific notation are not numerals, nor is a number followed by
    one letter (``3 n``); words of two letters or more after it are a unit (``68 apples``).
    """
    s = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _TEXT.sub(r" \1 ", _TEXT_UNIT.sub(" ", s))
    s = _DECORATIONS.sub("", s).replace("\\%", "%")
    s = s.rsplit("=", 1)[-1].strip().rstrip(".").strip()
    s = _UNIT_WORDS.sub("", s)
    while len(s) >= 2 and ((s[0], s[-1]) == ("{", "}") or ((s[0], s[-1]) == ("(", ")") and "," not in s)):
        s = s[1:-1].strip()
    s = re.sub(r"\s*([+-])\s*", r"\1", s).strip()  # "- 68" is -68; "50 + 18" stays two numbers
    if _PLAIN.fullmatch(s):
        return s
    for fraction in _FRACTIONS:
        match = fraction.fullmatch(s)
        if match:
            groups = match.groupdict()
            num = abs(int(groups["num"] or groups["num_digit"]))
            den = int(groups["den"] or groups["den_digit"])
            return s if den > 1 and gcd(num, den) == 1 else None
    return None


def plain_number(gold: str) -> str | None:
    """The numeral a gold answer is, or None for a symbolic gold. As ``numeral``, except that an
    ``=`` must follow one variable (``x = 5`` is 5; ``5x - 7y + 4 = 0`` and ``f(n) = 1`` are symbolic)."""
    if "=" in gold and not _VARIABLE_IS.match(gold):
        return None
    return numeral(gold)


def fails_numeral_rule(gold: str, answer: str) -> bool:
    """True when ``gold`` is a plain number and ``answer`` is not a numeral: the answer must be
    scored wrong under ``reward.numeral_answers`` whatever math-verify makes of it."""
    return plain_number(gold) is not None and numeral(answer) is None


# What never changes an expression's reading: spacing commands, sizing, \displaystyle, whitespace.
_LAYOUT = re.compile(r"\\left|\\right|\\displaystyle|\\[!,;: ]|~|\s+")
# Braces around one character or one command change nothing: \frac{1}{2} is \frac12, x^{2} is x^2.
_ONE_TOKEN_BRACES = re.compile(r"\{(\w|\\[A-Za-z]+)\}")


def expression_form(text: str) -> str:
    """``text`` written one way: ``\\dfrac``/``\\tfrac`` as ``\\frac``, without layout (spacing,
    ``\\left``/``\\right``, ``\\displaystyle``, whitespace), braces around one token, outer braces,
    ``$`` and a final full stop or comma. Two strings with one form are the same expression, written
    alike; reordered terms are another form."""
    s = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("$", "")
    s = _LAYOUT.sub("", s)
    previous = None
    while previous != s:
        previous, s = s, _ONE_TOKEN_BRACES.sub(r"\1", s)
    s = s.rstrip(".,")
    while len(s) >= 2 and s[0] == "{" and s[-1] == "}":
        s = s[1:-1]
    return s


def _top_level_pieces(form: str, cut: Callable[[str, int], bool]) -> list[str]:
    """``form`` cut before each character ``i`` at bracket depth 0 where ``cut(form, i)``."""
    pieces, depth, start = [], 0, 0
    for i, ch in enumerate(form):
        if depth == 0 and i > start and cut(form, i):
            pieces.append(form[start:i])
            start = i
        depth += ch in "{([" and form[i - 1 : i] != "\\"
        depth -= ch in "})]" and form[i - 1 : i] != "\\"
    pieces.append(form[start:])
    return [p for p in pieces if p]


def order_free_form(form: str) -> str:
    """An ``expression_form`` with its top-level terms, and each term's parenthesized factors, in a
    fixed order: ``x^2+5x+6`` and ``6+5x+x^2`` have one order-free form, ``(x+2)(x+3)`` and
    ``(x+3)(x+2)`` another. Only order is forgotten: nothing is expanded or evaluated."""
    terms = _top_level_pieces(form, lambda f, i: f[i] in "+-" and f[i - 1] not in "^_{(")
    signed = [t if t[0] in "+-" else "+" + t for t in terms]
    ordered = []
    for term in signed:
        sign, body = term[0], term[1:]
        # a factor starts at each top-level "(" and after each top-level ")" that no power or
        # subscript follows: (a)^{b}(c) is the factors (a)^{b} and (c)
        factors = _top_level_pieces(body, lambda f, i: f[i] == "(" or (f[i - 1] == ")" and f[i] not in "^_"))
        ordered.append(sign + "".join(sorted(factors)))
    return "".join(sorted(ordered))
