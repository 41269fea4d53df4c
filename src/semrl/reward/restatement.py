"""Whether an answer restates an expression of its problem, compared by structure.

math-verify's symbolic equality pays a copy of the question: ``\\sqrt{245}`` for "Simplify
$\\sqrt{245}$". Under ``reward.refuse_restatements`` (the default) an answer that is an expression
the problem states, and not the gold, is wrong (docs/rewards-and-data.md, "No restating the
problem"). Expressions are compared as trees: parsed without evaluation by the parser math-verify
uses (latex2sympy2_extended), in one notation, with associative operations flattened and the
arguments of commutative ones sorted. Parsing runs in the reward workers, under their CPU budget
(``semrl.reward.verify``); nothing is ever evaluated or simplified.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from semrl.reward.answer_form import expression_form, order_free_form

# The problem's mathematics: $...$, $$...$$, \(...\) and \[...\].
_MATH = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\[(.+?)\\\]|\\\((.+?)\\\)", re.DOTALL)
# A quotient of two integers, which the parser would reduce (\frac{6}{8} to 3/4): written as a
# product with a power -1 first, the form every other quotient takes, so that it keeps its terms.
_INTEGER_FRACTION = re.compile(r"\\frac\{\s*([+-]?\d+)\s*\}\{\s*([+-]?\d+)\s*\}")
# a/b or (a)/(b) of integers, neither a power's base or exponent (1/2^{1/2} is 1 over a root)
_INTEGER_SLASH = re.compile(
    r"(?:\(\s*([+-]?\d+)\s*\)|(?<![\w.})\\^_])(\d+))"  # the numerator, then the denominator:
    r"\s*/\s*(?:\(\s*([+-]?\d+)\s*\)(?![\^_])|([+-]?\d+)(?![\w.{(^_]))"
)
# The operations whose arguments commute (sorted) and associate (nested ones flattened).
_COMMUTATIVE = frozenset({"Add", "Mul", "FiniteSet", "Min", "Max", "And", "Or", "gcd", "lcm"})
# What the parser computes while it reads (a determinant, a gcd, a binomial coefficient): seconds of
# CPU for one expression (benchmarks/bench_restatements.py), so such text is compared as text.
_COMPUTED = re.compile(r"\\(?:begin|gcd|lcm|operatorname|det|binom|dbinom|tbinom|choose)(?![A-Za-z])")
_DIVISION = re.compile(r"\\div(?![A-Za-z])")
MAX_EXPRESSION_CHARS = 2000  # as the pool's MAX_ANSWER_CHARS: longer mathematics is not compared


def _key(expr: Any) -> str:
    """One string per expression tree, whatever its notation: products with or without a sign,
    every quotient as a product with a power -1 (``\\frac``, slash, ``\\sqrt``'s 1/2), signs moved
    out of products (``-\\frac{3}{4}`` is ``\\frac{-3}{4}``), a factor 1 dropped, associative
    operations flattened and commutative arguments sorted."""
    import sympy

    if isinstance(expr, sympy.Rational) and not isinstance(expr, sympy.Integer):  # \sqrt's 1/2
        inverse = sympy.Pow(sympy.Integer(expr.q), -1, evaluate=False)
        return _key(sympy.Mul(sympy.Integer(expr.p), inverse, evaluate=False))
    if isinstance(expr, sympy.Number):
        return f"-{_key(-expr)}" if expr < 0 else str(expr)
    if isinstance(expr, sympy.Symbol):
        return str(expr.name)
    if not expr.args:
        return str(sympy.srepr(expr))
    name = type(expr).__name__
    keys = [_key(arg) for arg in (_flattened(expr, name) if name in _COMMUTATIVE else expr.args)]
    if name == "Mul":
        negative, factors = False, []
        for key in keys:
            while key.startswith("-"):
                negative, key = not negative, key[1:]
            if key != "1":
                factors.append(key)
        body = factors[0] if len(factors) == 1 else f"Mul({','.join(sorted(factors))})" if factors else "1"
        return f"-{body}" if negative else body
    if name in _COMMUTATIVE:
        keys.sort()
    return f"{name}({','.join(keys)})"


def _flattened(expr: Any, name: str) -> list[Any]:
    """The arguments of ``expr``, an operation ``name``, with those of every nested ``name`` in their
    place, at any depth: ``a + (b + (c + d))`` has the four terms of ``a + b + c + d``."""
    out = []
    for arg in expr.args:
        out += _flattened(arg, name) if type(arg).__name__ == name else [arg]
    return out


@lru_cache(maxsize=8192)  # a problem's G answers and their gold come back together
def structure(latex: str) -> str | None:
    """The tree ``latex`` writes, as one string (``_key``); None where the parser reads no expression.

    Normalized as math-verify normalizes an answer (``\\dfrac``, ``\\left``, ``\\frac12``), except
    that a decimal stays a decimal (``0.5`` is not ``\\frac{1}{2}``) and no letter is read as a unit
    (math-verify's unit removal reads the ``b`` of ``(a)(b)`` as bits)."""
    if len(latex) > MAX_EXPRESSION_CHARS or _COMPUTED.search(latex):
        return None
    from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex

    text = normalize_latex(
        latex,
        NormalizationConfig(
            basic_latex=True, units=False, malformed_operators=True, nits=False, boxed="none", equations=False
        ),
    )
    text = _INTEGER_FRACTION.sub(r"(\1\\cdot\2^{-1})", text)
    text = _INTEGER_SLASH.sub(lambda m: f"({m[1] or m[2]}\\cdot{m[3] or m[4]}^{{-1}})", text)
    return _parsed_structure(text) if text else None


@lru_cache(maxsize=8192)
def _parsed_structure(text: str) -> str | None:
    """``structure`` of normalized ``text``, cached apart from ``structure``'s own cache: notations
    that normalize alike (``\\dfrac`` and ``\\frac``, spacing) are parsed once, and a parse costs
    13-24 ms of CPU (a 2-core Xeon; 332 parses instead of 436 for math500's golds written 4 ways)."""
    import sympy
    from latex2sympy2_extended import latex2sympy

    try:
        with sympy.evaluate(False):
            tree = _key(latex2sympy(text, normalization_config=None))
    except Exception:  # the parser raises what it cannot read; such text is compared as text
        return None
    # a division to carry out ("What is $1 \div 4$?") is not the fraction it gives (\frac{1}{4}, the
    # answer): the number of \div marks the tree (docs/rewards-and-data.md)
    divisions = len(_DIVISION.findall(text))
    return f"div{divisions}:{tree}" if divisions else tree


def mathematics(problem: str) -> list[str]:
    """The mathematics of ``problem``, in the order written: what stands in ``$...$``, ``$$...$$``,
    ``\\(...\\)`` and ``\\[...\\]``."""
    return [next(g for g in match.groups() if g is not None) for match in _MATH.finditer(problem)]


@lru_cache(maxsize=4096)
def stated_expressions(problem: str) -> tuple[frozenset[str], frozenset[str]]:
    """The expressions ``problem`` states, each of its mathematics (in ``$...$``, ``\\(...\\)``,
    ``\\[...\\]``) and each side of an ``=`` in it: their structures, and their text forms
    (``order_free_form``) for what the parser cannot read."""
    sides = []
    for segment in mathematics(problem):
        sides += [segment, *segment.split("=")] if "=" in segment else [segment]
    structures = {structure(side.strip()) for side in sides}
    forms = {order_free_form(expression_form(side)) for side in sides}
    return frozenset(s for s in structures if s is not None), frozenset(forms - {""})


def restates_problem(problem: str, gold: str, answer: str) -> bool:
    """True when ``answer`` is an expression ``problem`` states and not ``gold``: the answer copies
    the question ("Simplify $\\sqrt{245}$" answered ``\\sqrt{245}`` or ``245^{1/2}``) and must be
    scored wrong under ``reward.refuse_restatements`` whatever math-verify makes of it.

    Answer, gold and the problem's expressions are compared by ``structure``; where the answer or
    the gold is not parsed, by text form (layout and the order of top-level terms and factors). An
    answer that is the gold keeps its verdict, even where the problem states it ("Which is larger,
    $2^{10}$ or $10^3$?" answered ``2^{10}``). Where the gold is not an equation, the answer states
    what follows its last ``=`` (``x = \\sqrt{245}`` states ``\\sqrt{245}``)."""
    stated = answer if "=" in gold else answer.rsplit("=", 1)[-1]
    form = order_free_form(expression_form(stated))
    if not form:
        return False
    tree, gold_tree = structure(stated.strip()), structure(gold.strip())
    if tree is not None and gold_tree is not None:
        if tree == gold_tree:
            return False
    elif form == order_free_form(expression_form(gold)):
        return False
    structures, forms = stated_expressions(problem)
    return (tree is not None and tree in structures) or form in forms
