"""The restatement rule and the verification budget on MATH-style problems (issue 83).

For every problem of the package's math500 and math_train whose gold is not a plain number:

- **restatements**: the problem's main expression (its longest mathematics) copied into the answer,
  as written, in another layout (spacing, ``\\dfrac``, ``\\left``), the right side of its last ``=``,
  and with its top-level terms or factors reversed. math-verify alone judges each against the gold;
  those it pays are the hacks the rule must refuse. A paid restatement the rule lets through is a miss.
- **honest rewritings** of the gold: as written, respaced, with ``\\dfrac``, terms or factors reversed,
  and sympy's own LaTeX of the parsed gold. Those math-verify accepts must keep their reward: one the
  rule refuses is a false refusal. The CPU time of each such verification (``time.process_time`` of
  this process, one verification at a time) gives the distribution the default ``reward.timeout_s``
  is chosen from.

``python benchmarks/bench_restatements.py [--limit N] [--output FILE]`` prints the counts per kind
and the CPU-time quantiles, and writes every row to ``--output`` (jsonl).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from semrl.reward.answer_form import expression_form, order_free_form, plain_number, restates_problem
from semrl.reward.verify import _math_verify

BENCHMARKS = Path(__file__).parents[1] / "src" / "semrl" / "data" / "benchmarks"
_MATH = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\[(.+?)\\\]|\\\((.+?)\\\)", re.DOTALL)
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
    segments = [next(g for g in m.groups() if g is not None) for m in _MATH.finditer(problem)]
    return max(segments, key=len).strip() if segments else None


def _layout(text: str) -> str:
    return (
        text.replace("\\frac", "\\dfrac").replace("+", " + ").replace("(", "\\left(").replace(")", "\\right)")
    )


def same_form(a: str, b: str) -> bool:
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=int, default=None, help="problems of math_train at most")
    parser.add_argument("--output", type=Path, default=None)
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
                "terms reversed": reversed_terms(expression),
                "factors reversed": reversed_factors(expression),
            }
        honest = {
            "as written": gold,
            "layout": _layout(gold),
            "terms reversed": reversed_terms(gold),
            "factors reversed": reversed_factors(gold),
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
