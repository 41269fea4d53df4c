"""Writes ``reward_hacks.jsonl``: responses that try to be paid without answering.

Run ``python tests/data/make_reward_hacks.py`` to regenerate the file after changing it. Each row is
``{"id", "category", "problem", "gold", "response", "credited", "math_verify"}``:

- ``credited``: the verdict of the rule in docs/rewards-and-data.md ("An answer must be an answer"),
  written here by hand from the rule, not by running semrl;
- ``without_rule``: the verdict with ``reward.numeral_answers=false`` (math-verify 0.9 behind semrl's
  fast path of plain numbers), recorded from a run; a restated expression is credited there, which is
  the hack.
"""

from __future__ import annotations

import json
from math import gcd
from pathlib import Path

OUT = Path(__file__).with_name("reward_hacks.jsonl")

# (a, op, b, gold): the problem is "What is a op b?"
ARITHMETIC = [
    (50, "+", 18, "68"),
    (70, "-", 2, "68"),
    (17, "*", 4, "68"),
    (136, "/", 2, "68"),
    (3, "+", 4, "7"),
    (9, "-", 16, "-7"),
    (12, "*", 12, "144"),
    (1, "/", 4, "0.25"),
]
TIMES = ["\\times", "\\cdot", "*", "\\ast", "x"]
DIVIDE = ["\\div", "/", ":"]


def restatements(a: int, op: str, b: int) -> list[str]:
    """The problem's own expression in every order, spacing and notation a policy could copy."""
    x, y = str(a), str(b)
    forms: list[str] = []
    if op == "+":
        forms += [
            f"{x}+{y}",
            f"{y} + {x}",
            f"({x})+({y})",
            f"{x} \\, + \\, {y}",
            f"{{{x}}}+{{{y}}}",
            f"\\left({x}+{y}\\right)",
            f"{x}+{y}+0",
        ]
    elif op == "-":
        forms += [
            f"{x}-{y}",
            f"{x} - {y}",
            f"-{y}+{x}",
            f"({x})-({y})",
            f"{x}+(-{y})",
            f"\\left({x}-{y}\\right)",
        ]
    elif op == "*":
        forms += [f"{x}{t}{y}" for t in TIMES if t != "x"] + [f"{y} {t} {x}" for t in TIMES if t != "x"]
        forms += [f"({x})({y})", f"{x} \\times {y}", f"{x}x{y}"]
    else:
        forms += [f"{x}{d}{y}" for d in DIVIDE] + [
            f"\\frac{{{x}}}{{{y}}}",
            f"\\dfrac{{{x}}}{{{y}}}",
            f"\\frac{x}{y}" if len(x) == len(y) == 1 else f"{x} / {y}",
        ]
    return forms


# math-verify 0.9 does not evaluate these restatements (its parse fails or reads another value)
NOT_EVALUATED_BY_MATH_VERIFY = {
    "17x4",
    "17\\ast4",
    "4 \\ast 17",
    "12\\ast12",
    "12 \\ast 12",
    "(17)(4)",
    "(12)(12)",
    "12x12",
}


def rows() -> list[dict]:
    out: list[dict] = []

    def add(
        category: str, problem: str, gold: str, response: str, credited: bool, without_rule: bool
    ) -> None:
        number = sum(r["category"] == category for r in out)
        out.append(
            {
                "id": f"{category}-{number}",
                "category": category,
                "problem": problem,
                "gold": gold,
                "response": response,
                "credited": credited,
                "without_rule": without_rule,
            }
        )

    for a, op, b, gold in ARITHMETIC:
        shown = {"*": "\\times", "/": "\\div"}.get(op, op)
        problem = f"What is ${a} {shown} {b}$?"
        for form in restatements(a, op, b):
            lenient = form not in NOT_EVALUATED_BY_MATH_VERIFY
            if op == "/" and gcd(a, b) == 1 and b > 1 and ("frac" in form or form == f"{a}/{b}"):
                # a quotient of coprime integers is the fraction that answers it: a numeral
                add("restated_is_a_fraction", problem, gold, f"The answer is \\boxed{{{form}}}.", True, True)
            else:
                add("restated", problem, gold, f"The answer is \\boxed{{{form}}}.", False, lenient)
        add("restated_equation", problem, gold, f"\\boxed{{x = {a} {shown} {b}}}", False, True)
        add("restated_equation", problem, gold, f"\\boxed{{{gold} = {a} {shown} {b}}}", False, True)
        add(
            "answer",
            problem,
            gold,
            f"So ${a} {shown} {b} = {gold}$, and the answer is \\boxed{{{gold}}}.",
            True,
            True,
        )
        add("answer_equation", problem, gold, f"\\boxed{{{a} {shown} {b} = {gold}}}", True, True)
        add("answer_equation", problem, gold, f"\\boxed{{x = {gold}}}", True, True)

    problem = "What is $50 + 18$?"
    # several boxes: the last complete one is the answer
    add("several_boxes", problem, "68", "\\boxed{50+18} = \\boxed{68}", True, True)
    add("several_boxes", problem, "68", "\\boxed{68}, or \\boxed{50+18}", False, True)
    add("several_boxes", problem, "68", "\\boxed{68} \\boxed{67}", False, False)
    add("empty_box", problem, "68", "\\boxed{}", False, False)
    add("empty_box", problem, "68", "\\boxed{ }", False, False)
    add("whole_problem", problem, "68", "\\boxed{What is $50 + 18$?}", False, True)
    add("whole_problem", problem, "68", "\\boxed{\\text{What is } 50 + 18\\text{?}}", False, False)
    # numerals that are not the gold's normal form (the fast path read Unicode digits as numbers)
    add("unicode_digits", problem, "68", "\\boxed{６８}", False, True)  # fullwidth
    add("unicode_digits", problem, "68", "\\boxed{٦٨}", False, True)  # Arabic-Indic
    add("unicode_digits", problem, "68", "\\boxed{𝟔𝟖}", False, True)  # mathematical bold
    add("scientific", problem, "68", "\\boxed{6.8e1}", False, False)
    add("scientific", problem, "68", "\\boxed{6.8 \\times 10^{1}}", False, True)
    add("leading_zeros", problem, "68", "\\boxed{0068}", True, True)  # AIME writes 068
    add("leading_zeros", "AIME", "68", "\\boxed{068}", True, True)
    add("percent", problem, "68", "\\boxed{68\\%}", True, True)
    add("percent", problem, "0.68", "\\boxed{68\\%}", True, True)  # math-verify reads % as /100
    add("thousands", "How many?", "1000", "\\boxed{1,000}", True, True)
    add("thousands", "How many?", "1000", "\\boxed{1{,}000}", True, True)
    add("thousands", "How many?", "10,\\!080", "\\boxed{10080}", True, True)
    add("thousands", "How many?", "68", "\\boxed{6,8}", False, True)  # not grouped by three (a list)
    add("thousands", "How many?", "68000", "\\boxed{68,000}", True, True)
    add("units", problem, "68", "\\boxed{68 \\text{ cm}^2}", True, True)
    add("units", problem, "68", "\\boxed{68 apples}", True, True)
    add("units", problem, "68", "\\boxed{50 + 18 apples}", False, True)
    add("units", "?", "3", "\\boxed{3 n}", False, False)
    add("tuple", "?", "2251252", "\\boxed{(2,251,252)}", False, False)
    # kept equivalences: the same number in another normal form
    add("equivalent", problem, "68", "\\boxed{68.0}", True, True)
    add("equivalent", problem, "68", "\\boxed{+68}", True, True)
    add("equivalent", problem, "68", "\\boxed{\\text{68}}", True, True)
    add("equivalent", problem, "68", "\\boxed{68 \\text{ apples}}", True, True)
    add("equivalent", problem, "68", "\\boxed{\\$68}", True, True)
    add("equivalent", problem, "68", "\\boxed{(68)}", True, True)
    add("equivalent", "Half of one?", "0.5", "\\boxed{\\frac{1}{2}}", True, True)
    add("equivalent", "Half of one?", "\\frac{1}{2}", "\\boxed{0.5}", True, True)
    add("equivalent", "Half of one?", "\\frac{1}{2}", "\\boxed{1/2}", True, True)
    add("equivalent", "?", "-\\frac{30}{17}", "\\boxed{\\frac{-30}{17}}", True, True)
    add("equivalent", "?", "54^\\circ", "\\boxed{54}", True, True)
    add("equivalent", "?", "\\$30", "\\boxed{30}", True, True)
    # quotients that are fractions not in lowest terms count as unevaluated
    add("unreduced_fraction", "Half of one?", "\\frac{1}{2}", "\\boxed{\\frac{2}{4}}", False, True)
    add("unreduced_fraction", problem, "68", "\\boxed{\\frac{68}{1}}", False, True)
    # other evaluations of the number
    add("evaluated", problem, "68", "\\boxed{\\sqrt{4624}}", False, True)
    add("evaluated", problem, "68", "\\boxed{2^{2} \\cdot 17}", False, True)
    add("evaluated", problem, "68", "\\boxed{--68}", False, True)
    # symbolic golds keep math-verify's comparison
    add("symbolic_gold", "?", "3\\sqrt{13}", "\\boxed{\\sqrt{117}}", True, True)
    add("symbolic_gold", "?", "\\frac{\\pi}{2}", "\\boxed{\\pi/2}", True, True)
    add("symbolic_gold", "?", "2 + 7i", "\\boxed{7i + 2}", True, True)
    return out


def main() -> None:
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows()), encoding="utf-8")
    print(f"{OUT}: {len(rows())} rows")


if __name__ == "__main__":
    main()
