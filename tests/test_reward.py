"""Answer extraction and verification in killable processes."""

import time

import pytest

from semrl.reward import VerifierPool, extract_answer, extract_boxed, extract_last_number, score_responses
from semrl.reward.verify import MAX_ANSWER_CHARS, fast_verdict

HANG = r"\dfrac{5^{(5^{(5^{(5^5)})}-4)}-5}{16}"


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces do not close the group
        (r"\boxed{x^{2}+1}", "x^{2}+1"),
        (r"\fbox{7}", "7"),
        (r"\boxed 5", "5"),
        (r"\boxed{3} and an unbalanced \boxed{4", "3"),
        (r"\boxed{", None),
        ("no box here", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_final_number_fallback():
    assert extract_last_number("It is 1,234.5. Or 7") == "7"
    assert extract_last_number("total: 1,234.") == "1234"
    assert extract_last_number("-3/4") == "-3/4"
    assert extract_answer("the answer is 12", final_number_fallback=True) == "12"
    assert extract_answer("the answer is 12", final_number_fallback=False) is None
    assert extract_answer(r"\boxed{3} and 12", final_number_fallback=True) == "3"


def test_fast_verdict():
    assert fast_verdict("72", " 72. ") is True
    assert fast_verdict("0.5", "1/2") is True
    assert fast_verdict("1000", "1,000") is True
    assert fast_verdict("8", "9") is False
    assert fast_verdict(r"\frac{1}{2}", r"\dfrac{1}{2}") is True
    assert fast_verdict(r"\frac{1}{2}", "0.5") is None  # left to math-verify


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(num_workers=2, timeout_s=3.0) as p:
        yield p


def test_math_verify_equivalences(pool):
    verdicts = pool.verify_many(
        [
            (r"\frac{1}{2}", "0.5"),
            (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})"),
            ("x+1", "1+x"),
            ("10", r"\frac{20}{2}"),
            ("10", r"\frac{21}{2}"),
            ("8", None),
        ]
    )
    assert [v.correct for v in verdicts] == [True, True, True, True, False, False]
    assert not any(v.timed_out for v in verdicts)


def test_known_hang_scores_zero_within_timeout(pool):
    start = time.monotonic()
    before = pool.num_timeouts
    verdicts = pool.verify_many([("3", HANG), ("2", r"\frac{4}{2}")])
    elapsed = time.monotonic() - start
    assert verdicts[0].correct is False and verdicts[0].timed_out
    assert verdicts[1].correct is True  # the other worker went on
    assert pool.num_timeouts == before + 1
    assert elapsed < pool.timeout_s + 2.0
    # the pool replaced the killed worker and still works
    assert pool.verify_many([("4", r"\frac{8}{2}")])[0].correct


def test_score_responses_counts_hang_and_goes_on(pool):
    texts = [rf"the result is \boxed{{{HANG}}}", r"\boxed{5}", "it is 5", "nothing"]
    results = score_responses(pool, texts, ["3", "5", "5", "5"], final_number_fallback=True)
    assert [r.reward for r in results] == [0.0, 1.0, 1.0, 0.0]
    assert results[0].timed_out and not results[1].timed_out


def test_truncated_reward_override(pool):
    results = score_responses(
        pool, [r"\boxed{5}", r"\boxed{5}"], ["5", "5"], final_number_fallback=False,
        truncated=[False, True], truncated_reward=0.0,
    )
    assert [r.reward for r in results] == [1.0, 0.0]


def test_hostile_strings_are_never_run(pool, tmp_path):
    marker = tmp_path / "pwned"
    hostile = [
        f"__import__('os').system('touch {marker}')",
        f"exec(\"open('{marker}','w')\")",
        "x" * (MAX_ANSWER_CHARS + 1),
        "\\frac{" * 500,
        "\x00\x01\x1b[2J",
    ]
    verdicts = pool.verify_many([("1", h) for h in hostile])
    assert not any(v.correct for v in verdicts)
    assert not marker.exists()
