"""No reward for restating the problem: an answer to a plain-number gold must be a numeral
(``reward.numeral_answers``, docs/rewards-and-data.md "An answer must be an answer")."""

from __future__ import annotations

import json
import random
from math import gcd
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from semrl.data import Problem
from semrl.evaluation import EvalSettings, evaluate_dataset, judge_samples
from semrl.reward import Judge, VerifierPool, reward_functions
from semrl.reward.answer_form import numeral, plain_number
from semrl.rollout.engines import Generation

HACKS = [
    json.loads(line)
    for line in (Path(__file__).parent / "fixtures" / "reward_hacks.jsonl")
    .read_text(encoding="utf-8")
    .splitlines()
]
BENCHMARKS = Path(__file__).parents[2] / "src" / "semrl" / "data" / "benchmarks"


@pytest.fixture(scope="module")
def pools():
    with (
        VerifierPool(2, 5.0, numeral_answers=True) as strict,
        VerifierPool(2, 5.0, numeral_answers=False, refuse_restatements=False) as lenient,
    ):
        yield {True: strict, False: lenient}


def test_the_corpus_covers_what_the_issue_names():
    categories = {r["category"] for r in HACKS}
    assert {
        "restated",
        "restated_equation",
        "several_boxes",
        "empty_box",
        "whole_problem",
        "unicode_digits",
        "scientific",
        "leading_zeros",
        "percent",
        "thousands",
        "equivalent",
        "symbolic_gold",
        "restated_expression",
    } <= categories
    restated = [r for r in HACKS if r["category"].startswith("restated") and not r["credited"]]
    assert len(restated) >= 60 and sum(r["without_rule"] for r in restated) >= 50  # hacks that paid before


@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize("numeral_answers, field", [(True, "credited"), (False, "without_rule")])
def test_reward_hack_corpus_on_the_math_check(pools, numeral_answers, field):
    """Through the trainer's reward: ``reward_functions(["math"])`` in a pool with the rule on or off."""
    functions = reward_functions(["math"])
    results, _ = functions.score(
        pools[numeral_answers],
        [r["problem"] for r in HACKS],
        [r["response"] for r in HACKS],
        [[] for _ in HACKS],
        [{"answer": r["gold"]} for r in HACKS],
        final_number_fallback=True,
    )
    wrong = [
        (r["id"], r["response"], r["gold"], x.correct)
        for r, x in zip(HACKS, results, strict=True)
        if x.correct != r[field] or x.reward != float(r[field])
    ]
    assert not wrong


def test_reward_hack_corpus_in_evaluation(pools, tiny_model_dir):
    """Evaluation judges decoded samples (``judge_samples``): the same verdicts as the reward."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    wrong = []
    for row in HACKS:
        ids = torch.tensor(tokenizer.encode(row["response"], add_special_tokens=False))
        gen = Generation(
            ids,
            torch.zeros(len(ids)),
            torch.zeros(len(ids), 1),
            torch.zeros(len(ids), 1, dtype=torch.long),
            None,
            True,
        )
        sampled = judge_samples(
            Problem(row["id"], row["problem"], row["gold"]), [gen], tokenizer, Judge(pools[True])
        )
        assert sampled.texts == [row["response"]]  # the tokenizer gives the response back whole
        if sampled.rewards[0].correct != row["credited"]:
            wrong.append(row["id"])
    assert not wrong


# ---- the rule against an independent reference on random numerals and expressions ----


def _random_numeral(rng: random.Random) -> str:
    """A numeral in one of the forms the rule accepts, decorated."""
    kind = rng.choice(["int", "zeros", "grouped", "decimal", "frac", "slash", "percent"])
    sign = rng.choice(["", "", "-", "+"])
    value = rng.randrange(0, 10**7)
    if kind == "int":
        text = str(value)
    elif kind == "zeros":
        text = "0" * rng.randrange(1, 3) + str(value)
    elif kind == "grouped":
        value = rng.randrange(1000, 10**9)
        sep = rng.choice([",", "{,}", " ", ",\\!"])
        text = f"{value:,}".replace(",", sep)
    elif kind == "decimal":
        digits = rng.randrange(1, 4)
        text = f"{value}.{rng.randrange(0, 10**digits):0{digits}d}"
    elif kind == "percent":
        text = f"{value}\\%"
    else:
        den = rng.randrange(2, 500)
        num = rng.randrange(1, 1000)
        while gcd(num, den) != 1:
            num = rng.randrange(1, 1000)
        text = f"\\frac{{{num}}}{{{den}}}" if kind == "frac" else f"{num}/{den}"
    parentheses = "," not in text  # (1,000) is a tuple
    decorated = rng.choice(
        ["{}", "x = {}", "\\text{{{}}}", "{} \\text{{ apples}}", "\\${}", "{}^\\circ", "{{{}}}", "{}."]
        + ["({})", "\\left({}\\right)"] * parentheses
    )
    return decorated.format(sign + text)


def _random_expression(rng: random.Random) -> tuple[str, bool]:
    """Two numbers joined by arithmetic, and whether the rule reads it as a numeral: only a quotient
    of coprime integers written a/b with nothing between them, which is the fraction itself."""
    op = rng.choice(["+", "-", "\\times", "\\cdot", "*", "\\div", "/", "^", ":"])
    a, b = rng.randrange(0, 1000), rng.randrange(0, 1000)
    forms = [
        "{a}{op}{b}",
        "{a} {op} {b}",
        "({a}){op}({b})",
        "{{{a}}}{op}{{{b}}}",
        "x = {a} {op} {b}",
        "{a}{op}{b} \\text{{ apples}}",
        "{a} = {a}{op}{b}",
    ]
    form = rng.randrange(len(forms))
    is_fraction = op == "/" and b > 1 and gcd(a, b) == 1 and form in (0, 5, 6)
    if op == "/" and rng.random() < 0.5:  # \frac: a numeral only in lowest terms with a denominator above 1
        den = rng.randrange(1, 60)
        return f"\\frac{{{a}}}{{{den}}}", den > 1 and gcd(a, den) == 1
    return forms[form].format(a=a, op=op, b=b), is_fraction


def test_numeral_rule_on_random_numerals_and_expressions():
    rng = random.Random(0)
    for _ in range(3000):
        text = _random_numeral(rng)
        assert numeral(text) is not None, text
        expression, is_numeral = _random_expression(rng)
        assert (numeral(expression) is not None) == is_numeral, expression


# ---- equivalence kept: benchmark golds matched to themselves in another normal form ----


def _other_form(gold: str) -> str:
    """``gold`` written another way that states the same value."""
    plain = plain_number(gold)
    if plain is not None and "frac" not in plain and "/" not in plain and "%" not in plain:
        return plain.replace(",", "") + ("" if "." in plain else ".0") if "{" not in plain else plain
    return "$" + gold.replace("\\frac", "\\dfrac").replace("+", " + ") + "$"


@pytest.mark.e2e  # starts a process
def test_benchmark_golds_keep_their_verdicts(pools):
    golds = [
        json.loads(line)["answer"]
        for name in ("math500.jsonl", "olympiadbench.jsonl")
        for line in (BENCHMARKS / name).read_text(encoding="utf-8").splitlines()
    ]
    golds = [g.strip("$") for g in golds]
    assert (
        len(golds) >= 1000 and sum(plain_number(g) is None for g in golds) >= 300
    )  # symbolic golds among them
    pairs = [(g, _other_form(g)) for g in golds]
    strict = pools[True].verify_many(pairs)
    lenient = pools[False].verify_many(pairs)
    changed = [
        (p, s.correct, x.correct)
        for p, s, x in zip(pairs, strict, lenient, strict=True)
        if s.correct != x.correct
    ]
    assert not changed
    numeric = [s.correct for (g, _), s in zip(pairs, strict, strict=True) if plain_number(g) is not None]
    assert len(numeric) >= 700 and all(numeric)
    assert sum(s.correct for s in strict) >= 0.9 * len(pairs)  # math-verify reads most symbolic forms


def test_an_evaluation_keeps_the_rule_it_was_scored_under(tmp_path):
    """The pool and the settings must agree, and a directory scored before the rule is not resumed."""
    problem = [Problem("a", "What is 1 + 1?", "2")]
    settings = EvalSettings("m", "d", 1, 0.6, 1.0, 8, 0, None, True, 1, 1)
    with (
        VerifierPool(1, 5.0, numeral_answers=False) as pool,
        pytest.raises(ValueError, match="numeral_answers"),
    ):
        evaluate_dataset(None, None, pool, problem, settings, tmp_path)  # type: ignore[arg-type]
    old = {k: v for k, v in settings.__dict__.items() if k != "numeral_answers"}
    (tmp_path / "settings.json").write_text(json.dumps(old))
    with VerifierPool(1, 5.0) as pool, pytest.raises(ValueError, match=r"numeral_answers.*\(False, True\)"):
        evaluate_dataset(None, None, pool, problem, settings, tmp_path)  # type: ignore[arg-type]
