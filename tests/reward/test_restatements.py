"""No reward for restating a symbolic problem (``reward.refuse_restatements``, docs/rewards-and-data.md
"An answer must be an answer"), and verdicts bounded by CPU time, not by how busy the machine is."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from semrl.reward import VerifierPool, reward_functions
from semrl.reward.answer_form import expression_form, order_free_form
from semrl.reward.restatement import _parsed_structure, restates_problem, stated_expressions, structure

# issue 83's table: a copy of the question that math-verify's symbolic equality paid for
RESTATEMENTS = [
    ("Simplify $\\sqrt{245}$.", "\\boxed{\\sqrt{245}}", "7\\sqrt{5}"),
    ("Expand $(x+2)(x+3)$.", "\\boxed{(x+2)(x+3)}", "x^2+5x+6"),
    ("Factor $x^2+5x+6$.", "\\boxed{x^2+5x+6}", "(x+2)(x+3)"),
    (
        "Rationalize the denominator of $\\frac{1}{\\sqrt{2}}$.",
        "\\boxed{\\frac{1}{\\sqrt{2}}}",
        "\\frac{\\sqrt{2}}{2}",
    ),
]
# honest answers that keep their reward: a reordered product, a reordered sum, the gold's own form,
# an answer equal to an expression of the problem because that expression is the answer
HONEST = [
    ("Factor $x^2+5x+6$.", "\\boxed{(x+3)(x+2)}", "(x+2)(x+3)"),
    ("Expand $(x+2)(x+3)$.", "\\boxed{6 + 5x + x^2}", "x^2+5x+6"),
    ("Simplify the quotient $\\frac{x^2-1}{x-1}$.", "\\boxed{x+1}", "x+1"),
    ("Write the cube $(x+1)^3$ out.", "\\boxed{x^3 + 3x^2 + 3x + 1}", "x^3+3x^2+3x+1"),
    ("Find the side.", "\\boxed{\\sqrt{8}}", "2\\sqrt{2}"),
    ("Which is larger, $2^{10}$ or $10^3$?", "\\boxed{2^{10}}", "2^{10}"),
    ("Expand $(x+2)(x+3)$.", "\\boxed{x^2 + 5x + 6}", "x^2+5x+6"),
]


def _math_rewards(pool: VerifierPool, rows: list[tuple[str, str, str]]) -> list[float]:
    """The trainer's reward: ``reward_functions(["math"])`` scored in ``pool``, no final-number fallback."""
    results, _ = reward_functions(["math"]).score(
        pool,
        [problem for problem, _, _ in rows],
        [response for _, response, _ in rows],
        [[] for _ in rows],
        [{"answer": gold} for _, _, gold in rows],
        final_number_fallback=False,
    )
    return [r.reward for r in results]


@pytest.mark.e2e  # starts a process
def test_symbolic_restatements_earn_nothing_and_honest_answers_keep_their_reward():
    with (
        VerifierPool(2, 5.0) as strict,
        VerifierPool(2, 5.0, refuse_restatements=False) as lenient,
    ):
        assert _math_rewards(strict, RESTATEMENTS) == [0.0] * len(RESTATEMENTS)
        assert _math_rewards(lenient, RESTATEMENTS) == [1.0] * len(RESTATEMENTS)  # the hack, without the rule
        assert _math_rewards(strict, HONEST) == [1.0] * len(HONEST)


# ---- the rule against an independent reference on random expression trees ----

_ATOMS = ["x", "y", "b", "2", "3", "17", "\\pi", "a_1"]


def _random_tree(rng: random.Random, depth: int = 0) -> tuple:
    """An expression tree: ("atom", text), ("neg", t), ("add", [t...]), ("mul", [t...]),
    ("frac", t, t), ("pow", t, t) or ("sqrt", t)."""
    kinds = ["atom"] * 3 + (["neg", "add", "add", "mul", "mul", "frac", "pow", "sqrt"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "atom":
        return ("atom", rng.choice(_ATOMS))
    if kind == "neg":
        return ("neg", _random_tree(rng, depth + 1))
    if kind in ("add", "mul"):
        return (kind, [_random_tree(rng, depth + 1) for _ in range(rng.choice([2, 2, 3]))])
    if kind == "sqrt":
        return ("sqrt", _random_tree(rng, depth + 1))
    return (kind, _random_tree(rng, depth + 1), _random_tree(rng, depth + 1))


def _plain(tree: tuple) -> tuple:
    """``tree`` with a quotient as a product with a power -1 and a root as a power 1/2."""
    kind = tree[0]
    if kind == "atom":
        return tree
    if kind == "frac":
        return ("mul", [_plain(tree[1]), ("pow", _plain(tree[2]), ("neg", ("atom", "1")))])
    if kind == "sqrt":
        return ("pow", _plain(tree[1]), _plain(("frac", ("atom", "1"), ("atom", "2"))))
    if kind in ("add", "mul"):
        return (kind, [_plain(arg) for arg in tree[1]])
    return (kind, *(_plain(arg) for arg in tree[1:]))


def _reference(tree: tuple) -> str:
    """The independent reference, from the tree: sums and products as multisets of their arguments,
    nested ones flattened at any depth, a quotient as a product with a power -1, a root as a power
    1/2, signs out of products."""
    return _key(_plain(tree))


def _key(tree: tuple) -> str:
    kind = tree[0]
    if kind == "atom":
        return tree[1]
    if kind == "neg":
        inner = _key(tree[1])
        return inner[1:] if inner.startswith("-") else "-" + inner
    if kind == "pow":
        return f"pow({_key(tree[1])},{_key(tree[2])})"
    flat: list[tuple] = []
    todo = list(tree[1])
    while todo:
        arg = todo.pop()
        if arg[0] == kind:
            todo += arg[1]
        else:
            flat.append(arg)
    keys = [_key(arg) for arg in flat]
    if kind == "add":
        return f"add({','.join(sorted(keys))})"
    negative = sum(k.startswith("-") for k in keys) % 2 == 1
    factors = sorted(k.lstrip("-") for k in keys if k.lstrip("-") != "1")
    body = factors[0] if len(factors) == 1 else f"mul({','.join(factors)})" if factors else "1"
    return ("-" if negative else "") + body


def _write(tree: tuple, rng: random.Random) -> str:
    """``tree`` in LaTeX, in a random notation at every node: products with ``\\cdot``, ``\\times``,
    ``*`` or none, the arguments of sums and products in random order and sometimes regrouped,
    ``\\frac``/``\\dfrac``/``\\tfrac``/slash, ``\\sqrt{}`` or a power 1/2, ``\\left(``, spacing."""
    kind = tree[0]

    def group(text: str) -> str:
        return rng.choice(["({})", "\\left({}\\right)", "( {} )"]).format(text)

    def operand(sub: tuple) -> str:  # an argument that binds tighter than its operation
        text = _write(sub, rng)
        return text if sub[0] == "atom" and rng.random() < 0.5 else group(text)

    if kind == "atom":
        return tree[1]
    if kind == "neg":
        return "-" + operand(tree[1])
    if kind == "frac":
        if rng.random() < 0.3:
            return f"{group(_write(tree[1], rng))}/{group(_write(tree[2], rng))}"
        command = rng.choice(["\\frac", "\\dfrac", "\\tfrac"])
        return f"{command}{{{_write(tree[1], rng)}}}{{{_write(tree[2], rng)}}}"
    if kind == "sqrt":
        power = rng.choice(["", "^{1/2}", "^{\\frac{1}{2}}", "^{\\frac12}"])
        return f"\\sqrt{{{_write(tree[1], rng)}}}" if not power else group(_write(tree[1], rng)) + power
    if kind == "pow":
        return f"{group(_write(tree[1], rng))}^{{{_write(tree[2], rng)}}}"
    args = rng.sample(tree[1], len(tree[1]))
    if len(args) == 3 and rng.random() < 0.3:  # regrouped: a + (b + c)
        return _write((kind, [args[0], (kind, args[1:])]), rng)
    if kind == "add":
        return rng.choice(["+", " + "]).join(
            group(_write(a, rng)) if a[0] == "add" else _write(a, rng) for a in args
        )
    # side by side, integers read as a mixed number to math-verify's parser ((3)(17) is 20)
    numbers = any(a[0] == "atom" and a[1].isdigit() for a in args)
    sign = rng.choice(["\\cdot ", "\\times ", "*"] + ([] if numbers else [""]))
    # with a sign, a quotient, power or root needs no parentheses: a/b \cdot c/d reads ((a/b) c)/d
    bare = ("atom", "frac", "pow", "sqrt") if sign else ()
    return sign.join(
        _write(a, rng) if a[0] in bare and rng.random() < 0.5 else group(_write(a, rng)) for a in args
    )


# one worker: the parser's prediction tables (ANTLR's DFA, shared by a process's parses) fill once;
# a process's first 50 problems took 1.6-1.8 times as long as the next 50 (2-core Xeon)
@pytest.mark.xdist_group("restatements")
@pytest.mark.parametrize("chunk", range(3))  # 150 problems and 30 products in all
def test_the_rule_on_random_expression_trees_against_a_reference(chunk):
    """Answers written in random notations, orders and groupings: refused exactly when their tree
    is one the problem states and not the gold's (the reference decides both from the trees, the
    rule from the text)."""
    rng = random.Random(chunk)
    refused = 0
    for n in range(50):
        stated, gold, other = (_random_tree(rng) for _ in range(3))
        problem = f"Simplify ${_write(stated, rng)}$. Then ${_write(other, rng)}$ is given."
        if n % 2:  # the problem states the gold too, in another notation: the gold's tree stays allowed
            problem += f" Is it ${_write(gold, rng)}$?"
        gold_text = _write(gold, rng)
        keys = {_reference(stated), _reference(other)}
        for answer in (stated, other, gold, ("add", [gold, ("atom", "y")])):
            expected = _reference(answer) in keys and _reference(answer) != _reference(gold)
            text = _write(answer, rng)
            assert restates_problem(problem, gold_text, text) == expected, (problem, gold_text, text)
            # "x = <answer>" states the answer
            assert restates_problem(problem, gold_text, f"x = {text}") == expected
            refused += expected
    assert refused > 200 // 3
    # products of quotients written with slashes and no parentheses: a/b \cdot c/d \cdot e/f reads
    # (((a/b) c)/d e)/f, nested deeper than the \frac form's product
    for _ in range(10):
        quotients = [("frac", _random_tree(rng, 3), _random_tree(rng, 3)) for _ in range(rng.choice([3, 4]))]
        stated = ("mul", quotients)
        slashed = " \\cdot ".join(f"({_write(q[1], rng)})/({_write(q[2], rng)})" for q in quotients)
        problem = f"Simplify ${_write(stated, rng)}$."
        assert restates_problem(problem, "x+y", slashed), (problem, slashed)


@pytest.mark.xdist_group("restatements")
def test_notations_that_normalize_alike_are_parsed_once(monkeypatch):
    """``\\dfrac``, ``\\tfrac`` and ``\\left(`` read as ``\\frac`` and ``(``: one parse for each tree,
    whichever way it is written, and the same structure for all."""
    import latex2sympy2_extended

    parsed: list[str] = []
    parse = latex2sympy2_extended.latex2sympy
    monkeypatch.setattr(
        latex2sympy2_extended, "latex2sympy", lambda text, **kw: parsed.append(text) or parse(text, **kw)
    )
    structure.cache_clear()
    _parsed_structure.cache_clear()
    rng = random.Random(7)
    texts = {_write(_random_tree(rng), rng) for _ in range(40)}
    written = 0
    for text in texts:
        ways = {
            text,
            text.replace("\\frac", "\\dfrac"),
            text.replace("\\frac", "\\tfrac"),
            text.replace("\\left(", "(").replace("\\right)", ")"),
        }
        written += len(ways)
        assert len({structure(way) for way in ways}) == 1, ways
    assert written > len(texts) + 20  # the trees with a quotient or a \left( are written several ways
    assert len(parsed) == len(texts)


def test_text_forms_and_the_structures_a_problem_states():
    assert expression_form("\\left( \\dfrac{1}{2} \\right)") == "(\\frac12)"
    assert expression_form("{x^{2}}.") == "x^2"
    assert order_free_form("x^2+5x+6") == order_free_form("6+5x+x^2") == "+5x+6+x^2"
    assert order_free_form("(x+2)(x+3)") == order_free_form("(x+3)(x+2)") != order_free_form("(2+x)(x+3)")
    structures, forms = stated_expressions("Let $f = x^2$ and \\[g = 2x\\]; find \\(h\\).")
    assert structures == {
        "Equality(f,Pow(x,2))",
        "f",
        "Pow(x,2)",
        "Equality(g,Mul(2,x))",
        "g",
        "Mul(2,x)",
        "h",
    }
    assert forms == {"+f=x^2", "+f", "+x^2", "+g=2x", "+g", "+2x", "+h"}
    # what the parser would compute (a determinant) is left to the text form
    structures, forms = stated_expressions("Find $\\begin{vmatrix} a & b \\\\ c & d \\end{vmatrix}$.")
    assert structures == set() and len(forms) == 1


# ---- the benchmark golds: an honest answer written as its gold is never refused ----

BENCHMARKS = Path(__file__).parents[2] / "src" / "semrl" / "data" / "benchmarks"


@pytest.mark.xdist_group("restatements")
def test_golds_written_another_way_are_never_refused():
    rows = [
        json.loads(line) for line in (BENCHMARKS / "math500.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert len(rows) == 500  # benchmarks/bench_restatements.py reads math_train too, with more rewritings
    for row in rows:
        gold = row["answer"].strip("$")
        for written in (gold, f" {gold} ", gold.replace("\\frac", "\\dfrac"), gold.replace("{", "{ ")):
            assert not restates_problem(row["problem"], gold, written), (row["id"], written)


# ---- CPU time, not wall clock ----


@pytest.fixture
def timing_module(tmp_path, monkeypatch):
    (tmp_path / "timing_rewards.py").write_text(
        "import time\n"
        "def spins(prompts, completions, **kwargs):\n    while True:\n        pass\n"
        "def sleeps(prompts, completions, **kwargs):\n    time.sleep(1.5)\n    return [1.0]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return ("timing_rewards:spins", "timing_rewards:sleeps")


@pytest.mark.e2e  # starts a process
def test_a_call_is_bounded_by_its_cpu_time_and_by_the_wall_clock_net(timing_module):
    """A function that spins is stopped at its CPU budget; one that waits 1.5 s without using the CPU
    (as a worker does on a busy machine) is not, past a 0.5 s budget; the wall-clock net stops it."""
    call = [("p", "c", [1], {})]
    with VerifierPool(1, 0.5, timing_module, wall_timeout_s=60.0) as pool:
        pool.wait_ready()
        start = time.monotonic()
        (spun,) = pool.call_many(0, call)
        assert spun.timed_out and spun.score is None and pool.num_timeouts == 1
        assert time.monotonic() - start < 30.0  # the CPU budget, not the 60 s net
        pool.wait_ready()
        (slept,) = pool.call_many(1, call)
        assert slept.score == 1.0 and not slept.timed_out and pool.num_timeouts == 1
    with VerifierPool(1, 0.5, timing_module, wall_timeout_s=0.5) as pool:
        pool.wait_ready()
        (netted,) = pool.call_many(1, call)
        assert netted.timed_out and pool.num_timeouts == 1


# ---- a run takes each answer rule from its own option ----


@pytest.mark.parametrize(("numeral_answers", "refuse_restatements"), [(True, False), (False, True)])
def test_a_run_takes_each_answer_rule_from_its_own_option(
    digit_model_dir, seven_task, tmp_path, numeral_answers, refuse_restatements
):
    """The trainer's pool, as a run builds it from its config: a restatement is refused under
    reward.refuse_restatements alone, an evaluated expression under reward.numeral_answers alone."""
    from semrl.runtime.trainer import Trainer
    from tests.helpers import tiny_run_config

    cfg = tiny_run_config(
        digit_model_dir,
        seven_task,
        tmp_path,
        f"reward.numeral_answers={str(numeral_answers).lower()}",
        f"reward.refuse_restatements={str(refuse_restatements).lower()}",
    )
    trainer = Trainer(cfg)
    try:
        restated, evaluated = trainer.pool.verify_many(
            [("7\\sqrt{5}", "245^{1/2}"), ("68", "50+18")],
            ["Simplify $\\sqrt{245}$.", "What is fifty plus eighteen?"],
        )
    finally:
        trainer.close()
        trainer.env.processes.close()
    assert restated.correct is not refuse_restatements
    assert evaluated.correct is not numeral_answers
