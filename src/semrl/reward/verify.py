"""Answer verification with math-verify in killable worker processes.

math-verify can hang far past its own timeout on some inputs (e.g. huge nested exponents), and
its timeouts rely on ``signal.alarm``, which works only in a process's main thread. So every
comparison that is not settled by a cheap, safe string/number check runs in a worker process that
is killed and replaced when it exceeds its budget: ``timeout_s`` of the worker's own CPU time (the
kernel's ``ITIMER_PROF`` clock, so a verdict does not depend on how busy the machine is), with
``wall_timeout_s`` of wall clock as the net for a worker that never gets the CPU. A timeout scores
0, is counted and is not cached (docs/reliability.md, "Verification time").
"""

from __future__ import annotations

import ast
import multiprocessing as mp
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semrl.reward.answer_form import fails_numeral_rule
from semrl.reward.extract import as_number, normalize_answer
from semrl.reward.restatement import restates_problem

if TYPE_CHECKING:
    from semrl.config.sections import RewardConfig

READY = "ready"
STARTUP_TIMEOUT_S = 120.0  # a worker that cannot import math-verify in this long is broken
MAX_ANSWER_CHARS = 2000  # longer "answers" are hostile or degenerate: scored 0 without parsing
NOT_A_NUMERAL = "the gold is a number and the answer is not a numeral"
RESTATED = "the answer restates an expression of the problem"
# The signal the kernel sends a worker whose job has spent its CPU budget (ITIMER_PROF); absent on
# Windows, where the wall-clock limit alone applies.
CPU_LIMIT_SIGNAL = getattr(signal, "SIGPROF", None)


@dataclass(frozen=True)
class Verdict:
    """math-verify's answer for one (gold, answer) pair: correct or not, a time-out, or the error raised."""

    correct: bool
    timed_out: bool = False
    error: str | None = None


def fast_verdict(gold: str, answer: str) -> bool | None:
    """Decide cheaply when possible: equal normal forms, or two plain numbers. None = undecided."""
    g, a = normalize_answer(gold), normalize_answer(answer)
    if g == a:
        return True
    gn, an = as_number(g), as_number(a)
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


def judge(gold: str, answer: str, problem: str | None) -> tuple[bool, str | None]:
    """A worker's verdict on ``answer`` to ``gold`` (and the reason it is wrong, when a rule decides):
    a restatement of ``problem`` (None: the rule is off, or no problem is known) is wrong; else the
    cheap checks, else math-verify. The restatement rule parses, so it runs here, under the job's
    CPU budget, and not in the trainer's process."""
    if problem is not None and restates_problem(problem, gold, answer):
        return False, RESTATED
    quick = fast_verdict(gold, answer)
    return (quick, None) if quick is not None else (_math_verify(gold, answer), None)


def _cpu_limit(seconds: float) -> None:
    """Have the kernel end this process once it has spent ``seconds`` more of CPU time (user and
    system; 0: no limit). Its default action terminates the process even inside C code that holds
    the GIL, where a Python-level timer could not run."""
    if CPU_LIMIT_SIGNAL is not None:
        signal.setitimer(signal.ITIMER_PROF, seconds)


def _worker_main(conn: Connection, functions: tuple[str, ...], cpu_s: float) -> None:
    import logging
    import traceback

    import math_verify  # noqa: F401  (import before the first job, not inside its time budget)

    from semrl.reward.functions import load_function, scorer

    if CPU_LIMIT_SIGNAL is not None:
        signal.signal(CPU_LIMIT_SIGNAL, signal.SIG_DFL)  # the limit ends the process
    # math-verify warns on every call that its own timeouts are off: the pool enforces them.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    scorers = [scorer(load_function(name)) for name in functions]
    conn.send(READY)  # jobs are timed from here: a fresh worker's imports cost no job its budget
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        key, kind, payload = job
        _cpu_limit(cpu_s)
        try:
            if kind == "verify":
                result: tuple[Any, str | None] = judge(*payload)
            else:
                index, *args = payload
                result = (scorers[index](*args), None)
        except Exception as err:  # a parse failure is a wrong answer, a raising function scores 0
            if kind == "verify":
                result = (False, f"{type(err).__name__}: {err}"[:200])
            else:
                result = (None, traceback.format_exc()[-4000:])
        _cpu_limit(0)
        conn.send((key, *result))


def worker_context() -> mp.context.ForkServerContext | mp.context.SpawnContext:
    """How reward workers start: ``forkserver`` where the platform has it (Linux, macOS), else
    ``spawn``. The fork server is one fresh interpreter that imports math-verify once; each worker,
    and each replacement of a worker killed at its time-out, is forked from it in about 10 ms,
    against about 0.5 s for a ``spawn``-ed interpreter that imports math-verify again. Either way a
    worker starts clean (no model, no torch threads) and runs the main script's top-level code again
    (``unguarded_main_script``)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["math_verify", __name__])  # no effect once the server runs
    return ctx


class _Worker:
    def __init__(
        self,
        ctx: mp.context.ForkServerContext | mp.context.SpawnContext,
        functions: tuple[str, ...],
        cpu_s: float,
    ) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, functions, cpu_s), daemon=True)
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

    def spent_its_cpu(self) -> bool:
        """Whether the process ended because its job spent the CPU budget (after its pipe closed)."""
        self.proc.join(timeout=5)
        return CPU_LIMIT_SIGNAL is not None and self.proc.exitcode == -CPU_LIMIT_SIGNAL


@dataclass(frozen=True)
class CallResult:
    """One reward function's score of one completion (None: it returned None, raised or timed out)."""

    score: float | None
    error: str | None = None
    timed_out: bool = False


def unguarded_main_script() -> Path | None:
    """The script run as ``__main__`` when it has no top-level ``if __name__ == "__main__":`` guard
    (workers re-import it and run its top-level code again); None otherwise, or for an
    interactive session or a module run with ``-m``."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or getattr(main, "__spec__", None) is not None or not Path(path).is_file():
        return None
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [node.test.left, *node.test.comparators]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(
                isinstance(n, ast.Constant) and n.value == "__main__" for n in names
            ):
                return None
    return Path(path)


def _start_failure(what: str) -> RuntimeError:
    """Why a reward worker failed to start (``what`` it did), with the fix. A script without a main
    guard runs its top-level code again in each worker: the worker dies there, or is still
    running it (loading a model, say) when its start-up time is up."""
    script = unguarded_main_script()
    if script is not None:
        return RuntimeError(
            f"a reward worker {what} because {script} has no 'if __name__ == \"__main__\":' guard: "
            "reward workers are started with 'forkserver' or 'spawn', which import the script again in "
            "each worker, "
            "so its top-level code runs again there. Put the code that starts training (semrl.train, "
            "Trainer, VerifierPool) under 'if __name__ == \"__main__\":'"
        )
    return RuntimeError(
        f"a reward worker {what}; check that 'python -c \"import math_verify\"' works in this "
        "environment and that the reward functions import"
    )


class VerifierPool:
    """Scores (gold, answer) pairs and runs reward functions (``semrl.reward.functions``) on
    completions; each math-verify comparison and each function call gets ``timeout_s`` of its
    worker's CPU time, and ``wall_timeout_s`` of wall clock at most (null: 24 x ``timeout_s``, at
    least 120 s). ``functions`` are the names of the functions ``call_many`` may call (imported by
    every worker). ``numeral_answers`` (``reward.numeral_answers``): an answer to a gold that is a
    plain number must be a numeral, not an expression math-verify would evaluate;
    ``refuse_restatements`` (``reward.refuse_restatements``): an answer must not restate an
    expression of its problem (``semrl.reward.answer_form``)."""

    def __init__(
        self,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        functions: tuple[str, ...] = (),
        numeral_answers: bool = True,
        refuse_restatements: bool = True,
        wall_timeout_s: float | None = None,
    ) -> None:
        self.functions = tuple(functions)
        self.num_workers = num_workers
        self._timeout_s = timeout_s
        self.wall_timeout_s = wall_timeout_s if wall_timeout_s is not None else max(120.0, 24 * timeout_s)
        self.numeral_answers = numeral_answers
        self.refuse_restatements = refuse_restatements
        self._ctx = worker_context()
        self._workers: list[_Worker] = []
        # (gold, answer, the problem when the restatement rule reads it) -> verdict
        self._cache: dict[tuple[str, str, str | None], Verdict] = {}
        self.num_timeouts = 0

    @property
    def timeout_s(self) -> float:
        """Each job's CPU budget in seconds, fixed in a worker when it starts."""
        return self._timeout_s

    @timeout_s.setter
    def timeout_s(self, seconds: float) -> None:
        if any(w.proc.is_alive() for w in self._workers):
            raise RuntimeError(
                f"VerifierPool.timeout_s cannot change from {self._timeout_s:g} to {seconds:g} s while its "
                "workers run: each took its CPU budget when it started. close() the pool first (its "
                "workers start again, with the new budget, at the next call), or make another pool"
            )
        self._timeout_s = seconds

    @classmethod
    def from_config(cls, reward: RewardConfig, functions: tuple[str, ...] = ()) -> VerifierPool:
        """A pool under the ``reward`` section's workers, time limits and answer rules, whose workers
        import ``functions`` (the run's own reward functions)."""
        return cls(
            reward.num_workers,
            reward.timeout_s,
            functions,
            reward.numeral_answers,
            reward.refuse_restatements,
            reward.wall_timeout_s,
        )

    def _ensure_workers(self) -> None:
        self._workers = [w for w in self._workers if w.proc.is_alive()]
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._ctx, self.functions, self.timeout_s))

    def wait_ready(self) -> None:
        """Start the workers and wait until each has imported math-verify and the reward functions.
        A timed-out job's worker is replaced in the background; this waits for the replacements too,
        so what comes next is timed without another job's restart (e.g. before a timing)."""
        self._ensure_workers()
        while not all(w.ready for w in self._workers):
            starting = {w.conn: w for w in self._workers if not w.ready}
            deadline = min(w.started for w in starting.values()) + STARTUP_TIMEOUT_S
            # wait() is typed to return any waitable; it returns the connections it was given
            for conn in wait(list(starting), timeout=max(0.0, deadline - time.monotonic())):
                self._receive(starting[conn], {})  # type: ignore[index]
            self._expire({})

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

    def verify_many(
        self, pairs: list[tuple[str, str | None]], problems: list[str] | None = None
    ) -> list[Verdict]:
        """Verdict for every (gold, answer); ``answer=None`` (nothing extracted) is wrong.
        ``problems[i]``: the problem pair i answers, for the restatement rule (None: two answers
        compared with each other, or no problem known)."""
        results: list[Verdict | None] = [None] * len(pairs)
        pending: dict[tuple[str, str, str | None], list[int]] = {}
        for i, (gold, answer) in enumerate(pairs):
            problem = problems[i] if problems is not None and self.refuse_restatements else None
            settled = self._settled(gold, answer, problem)
            if settled is not None:
                results[i] = settled
            elif answer is not None:  # always: no answer is settled
                pending.setdefault((gold, answer, problem), []).append(i)
        if pending:
            keys = list(pending)
            for key, (correct, error, timed_out) in zip(
                keys, self._run_pool([("verify", k) for k in keys]), strict=True
            ):
                verdict = Verdict(bool(correct), timed_out, "timeout" if timed_out else error)
                if not timed_out:
                    self._cache[key] = verdict
                for i in pending[key]:
                    results[i] = verdict
        return [r if r is not None else Verdict(False) for r in results]

    def _settled(self, gold: str, answer: str | None, problem: str | None) -> Verdict | None:
        """The verdict found without a worker (no answer, too long, not a numeral for a number,
        cached, the gold as written, or two plain numbers that a restatement of ``problem`` could not
        make right); None: a worker must decide. ``problem``: the problem the restatement rule
        reads, None where it reads none."""
        if answer is None:
            return Verdict(False, error="no answer")
        if len(answer) > MAX_ANSWER_CHARS:
            return Verdict(False, error=f"answer longer than {MAX_ANSWER_CHARS} chars")
        if self.numeral_answers and fails_numeral_rule(gold, answer):
            return Verdict(False, error=NOT_A_NUMERAL)
        if (gold, answer, problem) in self._cache:
            return self._cache[(gold, answer, problem)]
        quick = fast_verdict(gold, answer)
        as_written = normalize_answer(gold) == normalize_answer(answer)  # the gold's own form
        if quick is False or (quick and (problem is None or as_written)):
            return Verdict(quick)
        return None

    def call_many(
        self, function: int, calls: list[tuple[str, str, list[int], dict[str, Any]]]
    ) -> list[CallResult]:
        """Score completions with ``functions[function]``: one (prompt, completion, completion ids,
        dataset columns) per call."""
        results = []
        for score, error, timed_out in self._run_pool([("call", (function, *call)) for call in calls]):
            value = None if error or timed_out else score
            results.append(CallResult(value, "timeout" if timed_out else error, timed_out))
        return results

    def _run_pool(self, jobs: list[tuple[str, Any]]) -> list[tuple[Any, str | None, bool]]:
        """(result, error, timed out) of each (kind, payload) job; a job's ``timeout_s`` starts when it
        reaches a ready worker."""
        self._ensure_workers()
        out: dict[int, tuple[Any, str | None, bool]] = {}
        queue = list(range(len(jobs)))
        queue.reverse()
        while queue or any(w.job is not None for w in self._workers):
            for w in self._workers:
                if w.ready and w.job is None and queue:
                    w.job = queue.pop()
                    w.deadline = time.monotonic() + self.wall_timeout_s
                    w.conn.send((w.job, *jobs[w.job]))
            by_conn = {w.conn: w for w in self._workers if w.job is not None or not w.ready}
            deadlines = [w.deadline if w.ready else w.started + STARTUP_TIMEOUT_S for w in by_conn.values()]
            # wait() is typed to return any waitable; it returns the connections it was given
            for conn in wait(list(by_conn), timeout=max(0.0, min(deadlines) - time.monotonic())):
                self._receive(by_conn[conn], out)  # type: ignore[index]
            self._expire(out)
        return [out[i] for i in range(len(jobs))]

    def _receive(self, w: _Worker, out: dict[int, tuple[Any, str | None, bool]]) -> None:
        """Take what worker ``w`` sent: ready, or its job's result. A worker that died while starting
        stops the pool with the reason; one that died on a job scores it 0 and is replaced."""
        try:
            message = w.conn.recv()
        except (EOFError, OSError):  # the worker died: its CPU budget spent, or e.g. out of memory
            if not w.ready:
                raise _start_failure("exited while starting") from None
            if w.job is not None and w.spent_its_cpu():
                out[w.job] = (None, None, True)
                self.num_timeouts += 1
            elif w.job is not None:
                out[w.job] = (None, "reward worker process died", False)
            self._replace(w)
            return
        if message == READY:
            w.ready = True
            return
        idx, result, error = message
        out[idx] = (result, error, False)
        w.job = None

    def _expire(self, out: dict[int, tuple[Any, str | None, bool]]) -> None:
        """Time out the jobs past their deadline (their workers are replaced); stop on a worker that
        did not start in time."""
        now = time.monotonic()
        for w in list(self._workers):
            if w.job is not None and now >= w.deadline:
                out[w.job] = (None, None, True)
                self.num_timeouts += 1
                self._replace(w)
            elif not w.ready and now >= w.started + STARTUP_TIMEOUT_S:
                w.kill()
                raise _start_failure(f"did not start within {STARTUP_TIMEOUT_S:.0f} s")

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        idx = self._workers.index(worker)
        self._workers[idx] = _Worker(self._ctx, self.functions, self.timeout_s)
