"""The restatement rule and the verification budget on MATH-style problems (issues 83, 90).

For every problem of the package's math500 and math_train whose gold is not a plain number:

- **restatements**: the problem's main expression (its longest mathematics) copied into the answer,
  as written, in another layout (spacing, ``\\dfrac``, ``\\left``), the right side of its last ``=``,
  with its top-level terms or factors reversed, and in other notations: products with ``\\cdot`` or
  ``*``, the terms inside each parenthesized factor reversed, a sum regrouped (``a+(b+c)``), roots
  as powers (``(245)^{1/2}``) and fractions with a slash (``(a)/(b)``). math-verify alone judges each
  against the gold; those it pays are the hacks the rule must refuse. A paid restatement the rule
  lets through is a miss.
- **honest rewritings** of the gold: the same rewritings, and sympy's own LaTeX of the parsed gold.
  Those math-verify accepts must keep their reward: one the rule refuses is a false refusal. The CPU
  time of each such verification (``time.process_time`` of this process, one verification at a time)
  gives the distribution the default ``reward.timeout_s`` is chosen from.

``--pool`` judges every form math-verify pays (``--pool-sample N``: every paid restatement and honest
forms drawn at random, N in all) again the way training does, through a
``VerifierPool`` (the rule in its workers, under the CPU budget), with ``--busy N`` processes
spinning beside it, and counts the verdicts that differ from the ones above.

``python benchmarks/bench_restatements.py [--limit N] [--pool] [--busy N] [--pool-sample N] [--output FILE]`` prints
the counts per kind and the CPU-time quantiles, and writes every row to ``--output`` (jsonl).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from semrl.reward.answer_form import expression_form, order_free_form, plain_number
from semrl.reward.restatement import mathematics, restates_problem, structure
from semrl.reward.verify import RESTATED, VerifierPool, _math_verify

BENCHMARKS = Path(__file__).parents[1] / "src" / "semrl" / "data" / "benchmarks"
HANG_S = 30  # a verification past this many seconds is counted as a hang and left


def _top_level(text: str, separators: str) -> list[str]:
    """``text`` cut at each of ``separators`` outside braces, brackets and parentheses; a separator
    starts the next piece (so that a sign stays with its term)."""
    pieces, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "{([" and not text[i - 1 : i] == "\\"
        depth -= ch in "})]" and not text[i - 1 : i] == "\\"
        if depth == 0 and ch in separators and i > start:
            pieces.append(text[start:i])
            start = i
    pieces.append(text[start:])
    return [p for p in pieces if p.strip()]


def reversed_terms(text: str) -> str | None:
    """The top-level sum with its terms in reverse order (``x^2+5x+6`` -> ``+6+5x+x^2``, the first
    term given a ``+``); None for a single term."""
    terms = _top_level(text, "+-")
    if len(terms) < 2:
        return None
    signed = [t if t[0] in "+-" else "+" + t for t in terms]
    return "".join(reversed(signed)).lstrip("+")


def reversed_factors(text: str) -> str | None:
    """A product of parenthesized factors in reverse order (``(x+2)(x+3)`` -> ``(x+3)(x+2)``)."""
    factors = re.findall(r"\([^()]*\)(?:\^\{?\d+\}?)?", text)
    if len(factors) < 2 or "".join(factors) != text.replace(" ", ""):
        return None
    return "".join(reversed(factors))


def _group_end(text: str, start: int) -> int:
    """The index after the brace group that opens at ``text[start]`` ("{")."""
    depth = 0
    for i in range(start, len(text)):
        depth += text[i] == "{" and text[i - 1 : i] != "\\"
        depth -= text[i] == "}" and text[i - 1 : i] != "\\"
        if depth == 0:
            return i + 1
    return len(text)


def roots_as_powers(text: str) -> str | None:
    """Each ``\\sqrt{X}`` as ``(X)^{1/2}`` and ``\\sqrt[n]{X}`` as ``(X)^{1/n}``; None without a root."""
    out, i, changed = [], 0, False
    while i < len(text):
        match = re.match(r"\\sqrt\s*(?:\[([^\]]+)\])?\s*", text[i:])
        if match and i + match.end() < len(text) and text[i + match.end()] in "{0123456789":
            j = i + match.end()
            end = _group_end(text, j) if text[j] == "{" else j + 1
            inner = text[j + 1 : end - 1] if text[j] == "{" else text[j]
            inner = roots_as_powers(inner) or inner
            out.append(f"({inner})^{{1/{match[1] or 2}}}")
            i, changed = end, True
        else:
            out.append(text[i])
            i += 1
    return "".join(out) if changed else None


def slash_fractions(text: str) -> str | None:
    """Each ``\\frac{A}{B}`` (or ``\\dfrac``, ``\\tfrac``) as ``(A)/(B)``; None without one."""
    out, i, changed = [], 0, False
    while i < len(text):
        match = re.match(r"\\[dt]?frac\s*(?=\{)", text[i:])
        if match:
            a_start = i + match.end()
            a_end = _group_end(text, a_start)
            if a_end < len(text) and text[a_end] == "{":
                b_end = _group_end(text, a_end)
                a, b = text[a_start + 1 : a_end - 1], text[a_end + 1 : b_end - 1]
                out.append(f"({slash_fractions(a) or a})/({slash_fractions(b) or b})")
                i, changed = b_end, True
                continue
        out.append(text[i])
        i += 1
    return "".join(out) if changed else None


def product_signs(text: str, sign: str) -> str | None:
    """Juxtaposed factors joined by ``sign``: ``)(``, and a digit before a letter, a command or
    ``(`` (``7\\sqrt{5}``, ``5x``, ``2(x+1)``); None where nothing is juxtaposed."""
    out = re.sub(r"\)\s*\(", lambda m: f"){sign}(", text)
    out = re.sub(
        r"(?<![\w^_{.])(\d+)\s*(?=[A-Za-z(]|\\(?!frac|dfrac|tfrac|cdot|times|right|left))",
        lambda m: m[1] + sign,
        out,
    )
    return out if out != text else None


def factor_terms_reversed(text: str) -> str | None:
    """The terms inside each innermost parenthesized sum in reverse order; None without one."""
    out = re.sub(r"\(([^()]*)\)", lambda m: f"({reversed_terms(m[1]) or m[1]})", text)
    return out if out != text else None


def regrouped(text: str) -> str | None:
    """A sum of three or more top-level terms as its first term plus the rest in parentheses
    (``a+b+c`` -> ``a+(b+c)``); None for fewer terms."""
    terms = _top_level(text, "+-")
    if len(terms) < 3:
        return None
    rest = "".join(terms[1:])
    return f"{terms[0]}+({rest.lstrip('+')})"


REWRITINGS = {
    "terms reversed": reversed_terms,
    "factors reversed": reversed_factors,
    "\\cdot products": lambda t: product_signs(t, "\\cdot "),
    "* products": lambda t: product_signs(t, "*"),
    "factor terms reversed": factor_terms_reversed,
    "regrouped": regrouped,
    "roots as powers": roots_as_powers,
    "slash fractions": slash_fractions,
}


def sympy_form(gold: str) -> str | None:
    """sympy's LaTeX of the gold as math-verify parses it, or None."""
    from math_verify import LatexExtractionConfig, parse
    from sympy import latex

    parsed = parse(f"\\boxed{{{gold}}}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)
    try:
        return latex(parsed[0]) if parsed else None
    except Exception:
        return None


def main_expression(problem: str) -> str | None:
    segments = mathematics(problem)
    return max(segments, key=len).strip() if segments else None


def _layout(text: str) -> str:
    return (
        text.replace("\\frac", "\\dfrac").replace("+", " + ").replace("(", "\\left(").replace(")", "\\right)")
    )


def same_form(a: str, b: str) -> bool:
    """``a`` and ``b`` are one expression: one tree where both parse, else one text form."""
    tree_a, tree_b = structure(a.strip()), structure(b.strip())
    if tree_a is not None and tree_b is not None:
        return tree_a == tree_b
    return order_free_form(expression_form(a)) == order_free_form(expression_form(b))


def _alarm(signum: int, frame: object) -> None:
    raise TimeoutError


def timed_verify(gold: str, answer: str) -> tuple[bool | None, float]:
    """math-verify's verdict and the CPU seconds it took; None past ``HANG_S`` of wall clock."""
    signal.alarm(HANG_S)
    start = time.process_time()
    try:
        verdict: bool | None = _math_verify(gold, answer)
    except TimeoutError:
        verdict = None
    except Exception:
        verdict = False
    finally:
        signal.alarm(0)
    return verdict, time.process_time() - start


def pool_check(rows: list[dict], busy: int, sample: int | None) -> None:
    """Judge every form math-verify paid (at most ``sample``: every paid restatement, and honest
    forms drawn at random) again through a ``VerifierPool`` (2 workers, the default
    5 s CPU budget), as training does, with ``busy`` spinning processes beside it; print how many
    verdicts differ from this process's (math-verify's, less the rule's refusals)."""
    import subprocess

    paid = [r for r in rows if r["math_verify"]]
    if sample is not None and sample < len(paid):  # every paid restatement, and honest forms at random
        hacks = [r for r in paid if r["group"] == "restatement"]
        honest = random.Random(0).sample(
            [r for r in paid if r["group"] == "honest"], max(0, sample - len(hacks))
        )
        paid = hacks + honest
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    started = time.monotonic()
    try:
        with VerifierPool(2, 5.0) as pool:
            verdicts = pool.verify_many(
                [(r["gold"], r["answer"]) for r in paid], [r["problem"] for r in paid]
            )
            timeouts = pool.num_timeouts
    finally:
        for spinner in spinners:
            spinner.kill()
    for row, verdict in zip(paid, verdicts, strict=True):
        row["pool_correct"] = verdict.correct
        row["pool_restated"] = verdict.error == RESTATED
    differ = sum(r["pool_correct"] != (not r["refused"]) for r in paid)
    print(
        f"through a VerifierPool beside {busy} spinning processes ({time.monotonic() - started:.0f} s): "
        f"{differ} of {len(paid)} verdicts differ from math-verify's less the rule's refusals; "
        f"{timeouts} time-outs",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=int, default=None, help="problems of math_train at most")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--pool", action="store_true", help="judge the paid forms again through a VerifierPool"
    )
    parser.add_argument("--busy", type=int, default=0, help="processes spinning beside the pool (--pool)")
    parser.add_argument("--pool-sample", type=int, default=None, help="forms judged through the pool at most")
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    rows = [json.loads(line) for line in (BENCHMARKS / "math500.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (BENCHMARKS / "math_train.jsonl").read_text().splitlines()]
    train = [r for r in train if plain_number(r["answer"]) is None]
    rows = [r for r in rows if plain_number(r["answer"]) is None] + train[: args.limit]
    _math_verify("1", "1")  # imports outside the measured calls
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its warning that its own timeouts are off
    out = []
    started = time.monotonic()
    for n, row in enumerate(rows, 1):
        problem, gold = row["problem"], row["answer"].strip("$")
        expression = main_expression(problem)
        restated = {}
        if expression:
            restated = {
                "as written": expression,
                "layout": _layout(expression),
                "right of =": expression.rsplit("=", 1)[-1] if "=" in expression else None,
                **{kind: rewrite(expression) for kind, rewrite in REWRITINGS.items()},
            }
        honest = {
            "as written": gold,
            "layout": _layout(gold),
            **{kind: rewrite(gold) for kind, rewrite in REWRITINGS.items()},
            "sympy": sympy_form(gold),
        }
        for group, forms in (("restatement", restated), ("honest", honest)):
            for kind, answer in forms.items():
                if answer is None:
                    continue
                verdict, cpu_s = timed_verify(gold, answer)
                refused = restates_problem(problem, gold, answer)
                out.append(
                    {
                        "id": row["id"],
                        "problem": problem,
                        "group": group,
                        "kind": kind,
                        "answer": answer,
                        "gold": gold,
                        "math_verify": verdict,
                        "refused": refused,
                        "cpu_s": round(cpu_s, 4),
                        # what the answer states (after its last "=", as the rule reads it) is the gold
                        "states_the_gold": same_form(
                            answer if "=" in gold else answer.rsplit("=", 1)[-1], gold
                        ),
                    }
                )
        if n % 100 == 0:
            print(
                f"{n}/{len(rows)} problems, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True
            )
    if args.pool:
        pool_check(out, args.busy, args.pool_sample)
    if args.output:
        args.output.write_text("".join(json.dumps(r) + "\n" for r in out))
    print(
        f"{len(rows)} problems with a symbolic gold (math500 and math_train{f'[:{args.limit}]' if args.limit else ''})"
    )
    print("| group | kind | forms | math-verify pays | refused of those paid |")
    print("|---|---|---|---|---|")
    for (group, kind), count in sorted(Counter((r["group"], r["kind"]) for r in out).items()):
        these = [r for r in out if (r["group"], r["kind"]) == (group, kind)]
        paid = [r for r in these if r["math_verify"]]
        refused = sum(r["refused"] for r in paid)
        print(f"| {group} | {kind} | {count} | {len(paid)} | {refused} |")
    honest_paid = [r for r in out if r["group"] == "honest" and r["math_verify"]]
    hacks = [r for r in out if r["group"] == "restatement" and r["math_verify"] and not r["states_the_gold"]]
    print(
        f"false refusals: {sum(r['refused'] for r in honest_paid)} of {len(honest_paid)} honest forms math-verify pays"
    )
    print(
        f"misses: {sum(not r['refused'] for r in hacks)} of {len(hacks)} paid restatements that do not state the gold as written"
    )
    times = sorted(r["cpu_s"] for r in honest_paid)
    hangs = sum(r["math_verify"] is None for r in out)
    quantiles = statistics.quantiles(times, n=1000)
    print(
        f"CPU s of the {len(times)} honest verifications math-verify pays: median {statistics.median(times):.3f}, "
        f"p99 {quantiles[989]:.3f}, p99.9 {quantiles[998]:.3f}, max {times[-1]:.3f}; "
        f"over 1 s: {sum(t > 1 for t in times)}, over 5 s: {sum(t > 5 for t in times)}; hangs past {HANG_S} s: {hangs}"
    )


if __name__ == "__main__":
    main()
