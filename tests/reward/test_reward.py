"""Answer extraction and verification in killable processes."""

import json
import time
from pathlib import Path

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
    # math-verify's own verdicts and hangs: the numeral rule (tests/reward/test_reward_hacks.py) would refuse
    # the expressions below before they reach a worker
    with VerifierPool(num_workers=2, timeout_s=3.0, numeral_answers=False) as p:
        yield p


@pytest.mark.e2e  # starts a process
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


@pytest.mark.e2e  # starts a process
def test_known_hang_scores_zero_within_timeout(pool):
    start = time.monotonic()
    before = pool.num_timeouts
    verdicts = pool.verify_many([("3", HANG), ("2", r"\frac{4}{2}")])
    elapsed = time.monotonic() - start
    assert verdicts[0].correct is False and verdicts[0].timed_out
    assert verdicts[1].correct is True  # the other worker went on
    assert pool.num_timeouts == before + 1
    # the budget is CPU time: on a busy machine its wall time is longer, but far below the 120 s net
    assert elapsed < 3 * pool.timeout_s + 2.0
    # the pool replaced the killed worker and still works
    assert pool.verify_many([("4", r"\frac{8}{2}")])[0].correct


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.e2e  # starts a process
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads parents from /proc")
def test_workers_and_their_replacements_fork_from_one_server_not_from_the_trainer():
    """Reward workers come from multiprocessing's fork server (it imported math-verify once), not from
    this process, and so does the worker that replaces one killed at its time-out."""
    import os

    with VerifierPool(num_workers=2, timeout_s=1.0, numeral_answers=False) as pool:
        pool.wait_ready()
        parents = {_parent(w.proc.pid) for w in pool._workers}
        assert len(parents) == 1 and os.getpid() not in parents
        assert pool.verify_many([("3", HANG)])[0].timed_out
        pool.wait_ready()
        assert {_parent(w.proc.pid) for w in pool._workers} == parents


@pytest.mark.e2e  # starts a process
def test_score_responses_counts_hang_and_goes_on(pool):
    texts = [rf"the result is \boxed{{{HANG}}}", r"\boxed{5}", "it is 5", "nothing"]
    results = score_responses(pool, texts, ["3", "5", "5", "5"], final_number_fallback=True)
    assert [r.reward for r in results] == [0.0, 1.0, 1.0, 0.0]
    assert results[0].timed_out and not results[1].timed_out


def test_truncated_reward_override(pool):
    results = score_responses(
        pool,
        [r"\boxed{5}", r"\boxed{5}"],
        ["5", "5"],
        final_number_fallback=False,
        truncated=[False, True],
        truncated_reward=0.0,
    )
    assert [r.reward for r in results] == [1.0, 0.0]


@pytest.mark.e2e  # starts a process
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


HOSTILE_FILE = Path(__file__).parent / "fixtures" / "hostile_answers.jsonl"
# CPU seconds (reward.timeout_s is 5 by default): the corpus only needs its 31 slow answers to stop
# (0.25 s: 12.9 s for the corpus alone, 20.5 s at 0.5 s). The margin: killing a worker, the cheap
# extraction of a 1 MB output, and the wall time 0.25 s of a worker's CPU takes when the test runs
# beside others (the budget counts CPU time, not wall clock)
HOSTILE_TIMEOUT_S = 0.25
HOSTILE_MARGIN_S = 4.0


def _hostile_corpus(marker: Path) -> list[dict]:
    rows = [json.loads(line) for line in HOSTILE_FILE.read_text(encoding="utf-8").splitlines()]
    for row in rows:
        body = row["prefix"] + row["text"] * row["repeat"] + row["suffix"]
        row["answer"] = body.replace("{MARKER}", str(marker))
    return rows


@pytest.mark.e2e  # starts a process
def test_hostile_answer_corpus(tmp_path):
    """Every answer of tests/reward/fixtures/hostile_answers.jsonl goes through the whole reward path
    (extraction, fast path, math-verify worker) alone, so its own wall time is measured."""
    marker = tmp_path / "pwned"
    rows = _hostile_corpus(marker)
    assert len(rows) >= 200
    assert {
        "huge_exponent",
        "deep_nesting",
        "megabyte",
        "broken_latex",
        "control_chars",
        "unicode_lookalike",
        "python_like",
    } <= {r["category"] for r in rows}
    assert max(len(r["answer"]) for r in rows) >= 1 << 20
    times: dict[str, float] = {}
    # without the numeral rule, so that every hostile expression reaches math-verify in a worker
    with VerifierPool(num_workers=2, timeout_s=HOSTILE_TIMEOUT_S, numeral_answers=False) as pool:
        for row in rows:
            # the workers a previous answer's timeout killed restart outside this answer's time
            pool.wait_ready()
            start = time.monotonic()
            (result,) = score_responses(pool, [row["answer"]], [row["gold"]], final_number_fallback=True)
            times[row["id"]] = time.monotonic() - start
            assert result.reward in (0.0, 1.0)
        timeouts = pool.num_timeouts
        # the pool still works after every hostile answer
        assert (
            score_responses(pool, [r"\boxed{\frac{6}{2}}"], ["3"], final_number_fallback=False)[0].reward
            == 1.0
        )
    worst = max(times, key=times.__getitem__)
    print(
        f"\nhostile corpus: {len(rows)} answers, {timeouts} timeouts, worst {times[worst]:.2f} s ({worst}), "
        f"total {sum(times.values()):.1f} s"
    )
    assert times[worst] < HOSTILE_TIMEOUT_S + HOSTILE_MARGIN_S, worst
    assert not marker.exists(), "a hostile answer was executed"


@pytest.mark.e2e  # starts a process
def test_wait_ready_waits_for_the_replacements_of_timed_out_workers():
    with VerifierPool(num_workers=1, timeout_s=0.3, numeral_answers=False) as pool:  # HANG reaches a worker
        pool.wait_ready()
        assert len(pool._workers) == 1 and all(w.ready for w in pool._workers)
        # the pool answers as soon as the killed worker's job is scored: its replacement is still starting
        assert pool.verify_many([("3", HANG)])[0].timed_out
        assert not any(w.ready for w in pool._workers)
        pool.wait_ready()
        assert all(w.ready and w.proc.is_alive() for w in pool._workers)


@pytest.mark.e2e  # starts a process
def test_fresh_worker_imports_do_not_count_against_a_job():
    """A job's timeout starts when a worker is ready: right after a hang killed both workers, a
    quick job must not time out while their replacements are still importing math-verify."""
    with VerifierPool(num_workers=1, timeout_s=0.3, numeral_answers=False) as pool:  # HANG reaches a worker
        assert pool.verify_many([("3", HANG)])[0].timed_out
        verdict = pool.verify_many([("2", r"\frac{4}{2}")])[0]
        assert verdict.correct and not verdict.timed_out
        assert pool.num_timeouts == 1


@pytest.mark.e2e  # starts a process
def test_reward_workers_start_without_torch():
    """A worker imports semrl.reward and math-verify only: torch (about 2.3 s of a 3 s start) stays
    out, so that the worker replacing a timed-out one is ready in under a second."""
    import subprocess
    import sys

    code = (
        "import sys, math_verify, semrl.reward, semrl.reward.verify, semrl.reward.functions\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


@pytest.mark.e2e  # starts a process
def test_a_timed_out_verdict_is_never_cached():
    """A time-out says nothing about the answer (a loaded machine, a slow worker): the same pair is
    sent to a worker again next time, and counted again, rather than answered from the cache."""
    with VerifierPool(num_workers=1, timeout_s=0.3, numeral_answers=False) as pool:  # HANG reaches a worker
        first = pool.verify_many([("3", HANG)])[0]
        second = pool.verify_many([("3", HANG)])[0]
        assert first.timed_out and second.timed_out and pool.num_timeouts == 2
        assert ("3", HANG, None) not in pool._cache
        with pytest.raises(
            RuntimeError, match="timeout_s cannot change from 0.3 to 30 s while its workers run"
        ):
            pool.timeout_s = 30.0  # the running workers took 0.3 s when they started
        pool.close()
        pool.timeout_s = 30.0  # a fresh worker's first parse can take over 0.3 s on a loaded machine
        assert pool.verify_many([("2", r"\frac{4}{2}")])[0].correct  # a settled verdict is cached
        assert ("2", r"\frac{4}{2}", None) in pool._cache
        assert pool._workers and all(w.proc.is_alive() for w in pool._workers)  # started again by the call
