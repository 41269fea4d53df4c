"""Crash injection for the crash-resume tests: ``SEMRL_FAULT_KILL=POINT@STEP`` makes the process
SIGKILL itself when it reaches ``POINT`` during training step ``STEP`` (1-based). Points:
``rollout`` (after generation, before rewards), ``update`` (after the first backward, before the
optimizer step) and ``checkpoint`` (model written to the temporary directory, not yet renamed).
Unset, it costs one dictionary lookup per point."""

from __future__ import annotations

import os
import signal

ENV = "SEMRL_FAULT_KILL"
POINTS = ("rollout", "update", "checkpoint")


def kill_point(point: str, step: int) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, at = spec.partition("@")
    if name not in POINTS or not at.isdigit():
        raise ValueError(f"{ENV}={spec!r}: expected POINT@STEP with POINT one of {', '.join(POINTS)}")
    if name == point and int(at) == step:
        os.kill(os.getpid(), signal.SIGKILL)
