"""A stalled engine is named, not waited on forever (docs/reliability.md, "A stalled engine").

The engines call ``beat()`` at each unit of progress: a decoding step of the hf engine or of the
row loop, a step of vLLM's engine core (which samples a token or finishes a request). While a
``Watchdog`` watches a phase (a step's rollout, an evaluation), a thread of its own checks the time
since the last beat; past ``timeout_s`` it prints what stalled, where, and the option, and ends the
process with exit code 3. It cannot raise in the main thread, which is blocked in the engine (in C
code, possibly holding the GIL): the process ends from the watchdog's thread, before any new
checkpoint is written, so the last checkpoint is the run's state. Training processes are ended by
their launcher when one of them exits (torchrun, accelerate).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

EXIT_STALLED = 3  # semrl's "stopped": the run cannot go on; the message says what to do


_ACTIVE: Watchdog | None = None  # the watchdog of the phase running now, which the engines' beats reach


def beat() -> None:
    """The engine made progress (a decoding step ran). Costs one clock read."""
    watchdog = _ACTIVE
    if watchdog is None:
        return
    watchdog.last_beat = time.monotonic()
    if watchdog.phase in watchdog.hang_in:
        threading.Event().wait()  # a test's stalled engine (SEMRL_FAULT_HANG): never returns


class Watchdog:
    """Ends the process when a watched phase goes ``timeout_s`` seconds without a beat (None: never).
    ``advice()`` is called once, at the stall, for the message's last sentences (the checkpoint
    kept, the command that continues); ``hang_in`` names phases whose engine is made to hang (the
    tests' ``SEMRL_FAULT_HANG``, ``semrl.core.faults``).

    It belongs to one training: its thread starts with the first watched phase and ends at
    ``close()``, and only the beats of its own phases reach it, so a second training in the same
    process is watched by its own limit and advice alone."""

    def __init__(
        self,
        timeout_s: float | None,
        engine: str,
        option: str,
        advice: Callable[[], str] = lambda: "",
        hang_in: frozenset[str] = frozenset(),
    ) -> None:
        self.timeout_s, self.engine, self.option, self.advice = timeout_s, engine, option, advice
        self.hang_in = hang_in
        self.last_beat = time.monotonic()
        self.phase: str | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    @contextmanager
    def watching(self, phase: str) -> Iterator[None]:
        """Watch ``phase`` (e.g. "step 12's rollout") for as long as the block runs; its time counts
        from the block's start, not from the last beat of an earlier phase."""
        global _ACTIVE
        if self.timeout_s is None:
            yield
            return
        self.last_beat, self.phase = time.monotonic(), phase
        outer, _ACTIVE = _ACTIVE, self
        if self._thread is None:
            self._closed.clear()
            self._thread = threading.Thread(target=self._watch, name="semrl-watchdog", daemon=True)
            self._thread.start()
        try:
            yield
        finally:
            self.phase, _ACTIVE = None, outer

    def close(self) -> None:
        """Stop the watching thread (the training ended or raised); a later phase starts a new one."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _watch(self) -> None:
        assert self.timeout_s is not None
        poll = min(1.0, self.timeout_s / 20)
        while not self._closed.wait(poll):
            phase, idle = self.phase, time.monotonic() - self.last_beat
            if phase is None or idle < self.timeout_s:
                continue
            message = (
                f"semrl: stopped: the {self.engine} engine made no progress (no token sampled, no request "
                f"finished) for {idle:.0f} s in {phase}, past {self.option}={self.timeout_s:g}. "
                f"{self.advice()}If a step of this run can honestly go that long without a token, raise "
                f"{self.option} (null: never stop).\n"
            )
            # straight to the file descriptor: the main thread may hold a logging or stdio lock
            os.write(2, message.encode())
            os._exit(EXIT_STALLED)


def phase(point: str, step: int) -> str:
    """The phase watched at fault point ``point`` of step ``step`` (``semrl.core.faults``)."""
    if point == "rollout":
        return f"step {step}'s rollout"
    return "the evaluation before training" if step == 0 else f"the evaluation after step {step}"
