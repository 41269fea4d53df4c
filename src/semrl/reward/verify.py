"""Answer verification with math-verify in killable worker processes.

math-verify can hang far past its own timeout on some inputs (e.g. huge nested exponents), and
its timeouts rely on ``signal.alarm``, which works only in a process's main thread. So every
comparison that is not settled by a cheap, safe string/number check runs in a worker process
that is SIGKILLed and replaced when it exceeds ``timeout_s``. A timeout scores 0 and is counted.
"""

from __future__ import annotations

import multiprocessing as mp
import re
import time
from dataclasses import dataclass
from fractions import Fraction
from multiprocessing.connection import Connection, wait

READY = "ready"
STARTUP_TIMEOUT_S = 120.0  # a worker that cannot import math-verify in this long is broken
MAX_ANSWER_CHARS = 2000  # longer "answers" are hostile or degenerate: scored 0 without parsing

_NUM = re.compile(r"^-?\d+(?:\.\d+)?(?:/\d+)?$")


@dataclass(frozen=True)
class Verdict:
    correct: bool
    timed_out: bool = False
    error: str | None = None


def normalize_answer(text: str) -> str:
    """Light, safe normalisation for the fast path (no parsing)."""
    s = text.strip().strip("$").strip()
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "\\displaystyle"):
        s = s.replace(token, "")
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s).rstrip(".")
    return s


def _as_number(s: str) -> Fraction | None:
    s = s.replace(",", "")
    if not _NUM.match(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def fast_verdict(gold: str, answer: str) -> bool | None:
    """Decide cheaply when possible: equal normal forms, or two plain numbers. None = undecided."""
    g, a = normalize_answer(gold), normalize_answer(answer)
    if g == a:
        return True
    gn, an = _as_number(g), _as_number(a)
    if gn is not None and an is not None:
        return gn == an
    return None


def _math_verify(gold: str, answer: str) -> bool:
    from math_verify import LatexExtractionConfig, parse, verify

    # LaTeX extraction only: the expression path calls sympy.parse_expr, which uses eval.
    config = [LatexExtractionConfig()]
    gold_parsed = parse(f"\\boxed{{{gold}}}", extraction_config=config, parsing_timeout=None)
    answer_parsed = parse(f"\\boxed{{{answer}}}", extraction_config=config, parsing_timeout=None)
    if not gold_parsed or not answer_parsed:
        return False
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=None))


def _worker_main(conn: Connection) -> None:
    import logging

    import math_verify  # noqa: F401  (import before the first job, not inside its time budget)

    # math-verify warns on every call that its own timeouts are off: the pool enforces them.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    conn.send(READY)  # jobs are timed from here: a fresh worker's imports cost no job its budget
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        key, gold, answer = job
        try:
            conn.send((key, _math_verify(gold, answer), None))
        except Exception as err:  # a parse failure is a wrong answer, not a crash
            conn.send((key, False, f"{type(err).__name__}: {err}"[:200]))


class _Worker:
    def __init__(self, ctx: mp.context.BaseContext) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()
        self.job: int | None = None
        self.deadline = 0.0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class VerifierPool:
    """Scores (gold, answer) pairs; each math-verify call gets ``timeout_s`` of wall clock."""

    def __init__(self, num_workers: int = 2, timeout_s: float = 5.0) -> None:
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        self._cache: dict[tuple[str, str], Verdict] = {}
        self.num_timeouts = 0

    def _ensure_workers(self) -> None:
        self._workers = [w for w in self._workers if w.proc.is_alive()]
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._ctx))

    def close(self) -> None:
        for w in self._workers:
            try:
                w.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            w.proc.join(timeout=2)
            if w.proc.is_alive():
                w.kill()
        self._workers = []

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def verify_many(self, pairs: list[tuple[str, str | None]]) -> list[Verdict]:
        """Verdict for every (gold, answer); ``answer=None`` (nothing extracted) is wrong."""
        results: list[Verdict | None] = [None] * len(pairs)
        pending: dict[tuple[str, str], list[int]] = {}
        for i, (gold, answer) in enumerate(pairs):
            if answer is None:
                results[i] = Verdict(False, error="no answer")
            elif len(answer) > MAX_ANSWER_CHARS:
                results[i] = Verdict(False, error=f"answer longer than {MAX_ANSWER_CHARS} chars")
            elif (gold, answer) in self._cache:
                results[i] = self._cache[(gold, answer)]
            else:
                quick = fast_verdict(gold, answer)
                if quick is not None:
                    results[i] = Verdict(quick)
                else:
                    pending.setdefault((gold, answer), []).append(i)
        if pending:
            for key, verdict in self._run_pool(list(pending)).items():
                if not verdict.timed_out:
                    self._cache[key] = verdict
                for i in pending[key]:
                    results[i] = verdict
        return [r if r is not None else Verdict(False) for r in results]

    def _run_pool(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], Verdict]:
        """Verdicts for ``keys``; a job's ``timeout_s`` starts when it reaches a ready worker."""
        self._ensure_workers()
        out: dict[tuple[str, str], Verdict] = {}
        queue = list(range(len(keys)))
        queue.reverse()
        while queue or any(w.job is not None for w in self._workers):
            for w in self._workers:
                if w.ready and w.job is None and queue:
                    w.job = queue.pop()
                    w.deadline = time.monotonic() + self.timeout_s
                    w.conn.send((w.job, *keys[w.job]))
            by_conn = {w.conn: w for w in self._workers if w.job is not None or not w.ready}
            deadlines = [w.deadline if w.ready else w.started + STARTUP_TIMEOUT_S for w in by_conn.values()]
            for conn in wait(list(by_conn), timeout=max(0.0, min(deadlines) - time.monotonic())):
                w = by_conn[conn]  # type: ignore[index]
                try:
                    message = conn.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):  # the worker died (e.g. out of memory): score 0
                    if not w.ready:
                        raise RuntimeError(
                            "a math-verify worker exited while starting; check that "
                            "'python -c \"import math_verify\"' works in this environment"
                        ) from None
                    if w.job is not None:
                        out[keys[w.job]] = Verdict(False, error="verifier process died")
                    self._replace(w)
                    continue
                if message == READY:
                    w.ready = True
                    continue
                idx, correct, error = message
                out[keys[idx]] = Verdict(bool(correct), error=error)
                w.job = None
            now = time.monotonic()
            for w in list(self._workers):
                if w.job is not None and now >= w.deadline:
                    out[keys[w.job]] = Verdict(False, timed_out=True, error="timeout")
                    self.num_timeouts += 1
                    self._replace(w)
                elif not w.ready and now >= w.started + STARTUP_TIMEOUT_S:
                    w.kill()
                    raise RuntimeError(
                        f"a math-verify worker did not start within {STARTUP_TIMEOUT_S:.0f} s; "
                        "check that 'python -c \"import math_verify\"' works in this environment"
                    )
        return out

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        idx = self._workers.index(worker)
        self._workers[idx] = _Worker(self._ctx)
