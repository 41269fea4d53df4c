"""Graceful preemption: cluster schedulers send SIGTERM (then SIGKILL after a grace period).

On SIGTERM or SIGINT the run finishes the step it is in (rollout, update, evaluation, logging) or
the base evaluation before step 1, writes a checkpoint, closes its worker pools and exits with
``EXIT_PREEMPTED``; ``--resume`` then continues exactly where it stopped. A second signal exits at
once. With several processes they agree, at the end of every step, to stop when any of them was
signalled. Before the handler (while loading) Ctrl-C stops at once: nothing was trained or saved.
"""

from __future__ import annotations

import logging
import os
import signal
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: try again later (with --resume)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def unblock_stop_signals() -> None:
    """Let SIGTERM and SIGINT reach this thread, and every thread and process it starts later.

    A signal mask survives fork and exec, so a process started by one that had blocked them (a
    launcher, a test runner's worker, a library's helper thread) would hold Ctrl-C and a scheduler's
    SIGTERM pending for ever and run on as if it had none. An ignored signal (``nohup``, ``cmd &``
    in a script) stays ignored: that is the caller's choice, not an accident.
    """
    if hasattr(signal, "pthread_sigmask"):  # POSIX
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


class StopSignal:
    """Records SIGTERM / SIGINT between ``install`` and ``uninstall`` (around the base evaluation and
    the training loop)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> StopSignal:
        try:
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        except ValueError:  # not the main thread: signals stay with their owner
            self._previous = {}
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # a second signal: no more waiting
            os._exit(128 + signum)
        self.received = signum
        logger.warning(
            "%s received: finishing this step (or the base evaluation), then writing a "
            "checkpoint and exiting (send it again to exit at once)",
            signal.Signals(signum).name,
        )
