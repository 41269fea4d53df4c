"""Writes ``hostile_answers.jsonl``: model outputs built to break, hang or hijack a reward path.

Run ``python tests/data/make_hostile_answers.py`` to regenerate the file after changing it. Each
row is ``{"id", "category", "gold", "prefix", "text", "repeat", "suffix"}``; the answer is
``prefix + text * repeat + suffix``, so that megabyte-long outputs stay small in the repository. ``{MARKER}`` in a text is replaced by
the test with a path that must never be created (code that would create it must not run).
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("hostile_answers.jsonl")


def rows() -> list[dict]:
    out: list[dict] = []

    def add(
        category: str, text: str, gold: str = "3", repeat: int = 1, prefix: str = "", suffix: str = ""
    ) -> None:
        number = sum(r["category"] == category for r in out)
        out.append(
            {
                "id": f"{category}-{number}",
                "category": category,
                "gold": gold,
                "prefix": prefix,
                "text": text,
                "repeat": repeat,
                "suffix": suffix,
            }
        )

    # Huge exponents and towers: sympy would try to evaluate them.
    for base in ("2", "9", "10", "5", "7"):
        add("huge_exponent", rf"\boxed{{{base}^{{{base}^{{{base}^{{{base}^{{{base}}}}}}}}}}}")
        add("huge_exponent", rf"\boxed{{{base}^{{99999999999}}}}")
        add("huge_exponent", rf"\boxed{{{base}!!!!!!}}")
    add("huge_exponent", r"\boxed{\dfrac{5^{(5^{(5^{(5^5)})}-4)}-5}{16}}")  # math-verify issue 65
    add("huge_exponent", r"\boxed{10^{10^{10^{10}}} - 10^{10^{10^{10}}} + 3}")
    add("huge_exponent", r"\boxed{(10^{100000})!}")
    add("huge_exponent", r"\boxed{2^{2^{2^{2^{2^{2}}}}} \bmod 7}")
    add("huge_exponent", r"\boxed{1e999999999}")
    add("huge_exponent", r"\boxed{\binom{10^{12}}{10^{6}}}")
    add("huge_exponent", r"\boxed{\sum_{n=1}^{10^{15}} n^{n}}")
    add("huge_exponent", r"\boxed{\prod_{k=1}^{99999999} k}")
    add("huge_exponent", r"\boxed{\int_0^{10^{9}} x^{x^{x}} dx}")
    add("huge_exponent", r"\boxed{e^{e^{e^{e^{e}}}}}")

    # Deep nesting: recursion limits in parsers.
    for depth in (50, 200, 1000, 5000):
        add("deep_nesting", r"\boxed{" + r"\frac{1}{" * depth + "2" + "}" * depth + "}")
        add("deep_nesting", r"\boxed{" + r"\sqrt{" * depth + "3" + "}" * depth + "}")
        add("deep_nesting", r"\boxed{" + "(" * depth + "3" + ")" * depth + "}")
        add("deep_nesting", r"\boxed{" + "{" * depth + "3" + "}" * depth + "}")
        add("deep_nesting", r"\boxed{" + r"\left(" * depth + "3" + r"\right)" * depth + "}")
        add("deep_nesting", r"\boxed{" + "x^{" * depth + "2" + "}" * depth + "}")
    add("deep_nesting", r"\boxed{" + "[" * 3000 + "3" + "]" * 3000 + "}")

    # Megabyte-long outputs: quadratic scans in extraction, huge regex inputs.
    mb = 1 << 20
    add("megabyte", "9", repeat=mb)
    add("megabyte", "a", repeat=mb)
    add("megabyte", r"\boxed{", repeat=mb // 7)
    add("megabyte", r"\boxed{3}", repeat=mb // 9)
    add("megabyte", r"\boxed 3 ", repeat=mb // 9)
    add("megabyte", r"\fbox{", repeat=mb // 6)
    add("megabyte", "{", repeat=mb)
    add("megabyte", "}", repeat=mb)
    add("megabyte", "\\", repeat=mb)
    add("megabyte", "1,", repeat=mb // 2)
    add("megabyte", "1.", repeat=mb // 2)
    add("megabyte", "-1/", repeat=mb // 3)
    add("megabyte", "$", repeat=mb)
    add("megabyte", " ", repeat=mb)
    add("megabyte", "\n", repeat=mb)
    add("megabyte", r"\boxed{" + "9" * 64, repeat=mb // 71)
    add("megabyte", "1", repeat=mb, prefix=r"\boxed{", suffix="}")
    add("megabyte", "12", repeat=mb // 2, prefix=r"\boxed{\frac{", suffix="}{7}}")
    add("megabyte", "x+", repeat=mb // 2, prefix=r"\boxed{", suffix="1}")
    add("megabyte", r"\frac{1}{", repeat=mb // 9, prefix=r"\boxed{", suffix="2")
    add("megabyte", r"\text{", repeat=mb // 6)
    add("megabyte", "The answer is ", repeat=mb // 14)

    # Unbalanced braces and broken LaTeX.
    for text in (
        r"\boxed{3",
        r"\boxed{{3}",
        r"\boxed{3}}}}",
        r"\boxed}3{",
        r"\boxed{\}",
        r"\boxed{\{}",
        r"\boxed{3\}",
        r"\boxed{\frac{1}{2}",
        r"\boxed{\frac{1}{",
        r"\boxed{\frac}",
        r"\boxed{\sqrt}",
        r"\boxed{^}",
        r"\boxed{_}",
        r"\boxed{}",
        r"\boxed{ }",
        r"\boxed{\left(3}",
        r"\boxed{3\right)}",
        r"\boxed{\begin{matrix}3}",
        r"\boxed{\end{matrix}}",
        r"\boxed{\begin{array}{" + "c" * 500 + "}1\\end{array}}",
        r"\boxed{$$3}",
        r"\boxed{3$}",
        r"\boxed{\\\\\\}",
        r"\boxed{\frac{1}{0}}",
        r"\boxed{0/0}",
        r"\boxed{1/0}",
        r"\boxed{\log(0)}",
        r"\boxed{\infty - \infty}",
        r"\boxed{\frac{\infty}{\infty}}",
        r"\boxed{\sqrt{-1}^{i}}",
        r"\boxed{3 = }",
        r"\boxed{= 3 =}",
        r"\boxed{3,,,,}",
        r"\boxed{;;;}",
        r"\boxed{\mathrm{}}",
        r"\boxed{\unknowncommand{3}}",
        r"\boxed{\def\x{\x}\x}",
        r"\boxed{\newcommand{\a}{\a}\a}",
        r"\boxed{\input{/etc/passwd}}",
        r"\boxed{\include{/etc/shadow}}",
        r"\boxed{\write18{touch {MARKER}}}",
        r"\boxed{\immediate\write18{rm -rf /}}",
        r"\boxed{\catcode`\{=12 3}",
    ):
        add("broken_latex", text)

    # Control characters and odd whitespace.
    for text in (
        "\x00",
        "\\boxed{3\x00}",
        "\\boxed{\x1b[2J3}",
        "\\boxed{3\x7f}",
        "\\boxed{\u202e3}",
        "\\boxed{3\u200b}",
        "\\boxed{\ufeff3}",
        "\\boxed{3\r\n}",
        "\\boxed{\t3\t}",
        "\\boxed{\x0c3}",
        "\\boxed{\x08\x08\x083}",
        "\\boxed{\ud7ff}",
        "\\boxed{\uffff}",
        "\\boxed{\U0010ffff}",
        "\x1b]0;pwned\x07\\boxed{3}",
        "\\boxed{3}\x00\\boxed{4}",
        "\\boxed{" + "\x00" * 1000 + "}",
        "\\boxed{\u2028\u20293}",
        "\\boxed{3\u0301\u0301\u0301\u0301\u0301\u0301}",
        "\\boxed{" + "\u0300" * 5000 + "}",
    ):
        add("control_chars", text)

    # Unicode look-alikes: must not be read as the gold digits or as LaTeX commands.
    for text in (
        "\\boxed{\uff13}",
        "\\boxed{\u0663}",
        "\\boxed{\U0001d7d1}",
        "\\boxed{\u2083}",
        "\\boxed{\u00b3}",
        "\\boxed{\u2462}",
        "\\boxed{\u2162}",
        "\\boxed{\u0417}",
        "\\boxed{\u01b7}",
        "\uff3cboxed\uff5b3\uff5d",
        "\\b\u043exed{3}",
        "\\boxed\u2009{3}",
        "\\boxed{\u22123}",
        "\\boxed{\u20133}",
        "\\boxed{3\u2044 1}",
        "\\boxed{\u00bd}",
        "\\boxed{\u221a9}",
        "\\boxed{\u03c0}",
        "\\boxed{\u221e}",
        "\\boxed{\u2148}",
        "\\boxed{\u0033\ufe0f\u20e3}",
        "\\boxed{\U0001f4af}",
        "\\boxed{\u0968}",
        "\\boxed{\u17e3}",
    ):
        add("unicode_lookalike", text)

    # Strings that look like Python (or shell): must never be evaluated.
    for text in (
        "__import__('os').system('touch {MARKER}')",
        r"\boxed{__import__('os').system('touch {MARKER}')}",
        r"\boxed{exec(\"open('{MARKER}','w')\")}",
        r"\boxed{eval(\"__import__('pathlib').Path('{MARKER}').touch()\")}",
        r"\boxed{open('{MARKER}', 'w').write('x')}",
        r"\boxed{(lambda: __import__('os').system('touch {MARKER}'))()}",
        r"\boxed{[c for c in ().__class__.__base__.__subclasses__()]}",
        r"\boxed{().__class__.__mro__[1].__subclasses__()}",
        r"\boxed{globals()['__builtins__']['__import__']('os').remove('{MARKER}')}",
        r"\boxed{compile('1','','eval')}",
        r"\boxed{Symbol('x').__class__.__init__.__globals__}",
        r"\boxed{sympify(\"__import__('os').system('touch {MARKER}')\")}",
        r"\boxed{S('1')}",
        r"\boxed{$(touch {MARKER})}",
        r"\boxed{`touch {MARKER}`}",
        r"\boxed{; touch {MARKER}}",
        r"\boxed{import os; os.system('touch {MARKER}')}",
        r"\boxed{lambda x: x}",
        r"\boxed{1 if True else 2}",
        r"\boxed{[1]*10**10}",
        r"\boxed{'a'*10**10}",
        r"\boxed{9**9**9**9}",
        r"\boxed{10**10**10}",
        r"\boxed{__builtins__}",
        r"\boxed{pickle.loads(b'cos\nsystem\n(S\'touch {MARKER}\'\ntR.')}",
    ):
        add("python_like", text)

    # Plausible but wrong or ambiguous answers: must score as the verifier decides, without error.
    for text in (
        r"\boxed{3}",
        r"\boxed{3.0}",
        r"\boxed{\frac{6}{2}}",
        r"\boxed{x = 3}",
        r"\boxed{3 \text{ apples}}",
        r"\boxed{(3)}",
        r"\boxed{\{3\}}",
        r"\boxed{[3, 3]}",
        r"\boxed{3 + 0i}",
        r"\boxed{3^{1}}",
        r"\boxed{\sqrt{9}}",
        r"\boxed{-3}",
        r"\boxed{3, 4}",
        r"\boxed{\pm 3}",
        r"\boxed{3\%}",
    ):
        add("plausible", text)
    for gold, text in (
        (r"\frac{1}{2}", r"\boxed{0.5}"),
        (r"\frac{1}{2}", r"\boxed{\frac{2}{4}}"),
        (r"\sqrt{2}", r"\boxed{2^{1/2}}"),
        (r"(1, 2)", r"\boxed{\left(1,2\right)}"),
        (r"\pi", r"\boxed{3.14159}"),
        (r"x^2+1", r"\boxed{1+x^{2}}"),
        (r"10^{100}", r"\boxed{10^{100}}"),
        (r"2^{2^{2^{2^{2}}}}", r"\boxed{2^{65536}}"),
    ):
        add("plausible", text, gold=gold)
    return out


def main() -> None:
    data = rows()
    OUT.write_text("".join(json.dumps(r, ensure_ascii=True) + "\n" for r in data), encoding="utf-8")
    print(f"wrote {len(data)} hostile answers to {OUT}")


if __name__ == "__main__":
    main()
