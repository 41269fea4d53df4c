"""Fault injection for the crash, preemption and disk-full tests.

``SEMRL_FAULT_KILL=POINT@STEP`` makes the process SIGKILL itself when it reaches ``POINT`` during
training step ``STEP`` (1-based); ``SEMRL_FAULT_SIGNAL=POINT@STEP[,POINT@STEP...]`` sends it SIGTERM
there once and goes on (a preemption); ``SEMRL_FAULT_ENOSPC=STEP`` makes writing the checkpoint of step
``STEP`` fail as on a full disk. Points: ``rollout`` (after generation, before rewards), ``update``
(after the first backward, before the optimizer step), ``evaluate`` (the evaluation after step STEP;
0: before training) and ``checkpoint`` (model written to the temporary directory, not yet renamed).
Unset, each point costs a few dictionary lookups.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "SEMRL_FAULT_KILL"
SIGNAL_ENV = "SEMRL_FAULT_SIGNAL"
ENOSPC_ENV = "SEMRL_FAULT_ENOSPC"
RANK_ENV = "SEMRL_FAULT_RANK"  # with several processes: only this rank is signalled
POINTS = ("rollout", "update", "evaluate", "checkpoint")
_signalled: set[tuple[str, int]] = set()  # a point can be reached several times in a step (micro-batches)


def _matches(spec: str, env: str, point: str, step: int) -> bool:
    for item in spec.split(","):
        name, _, at = item.partition("@")
        if name not in POINTS or not at.isdigit():
            raise ValueError(f"{env}={spec!r}: expected POINT@STEP with POINT one of {', '.join(POINTS)}")
        if name == point and int(at) == step:
            return True
    return False


def kill_point(point: str, step: int) -> None:
    spec = os.environ.get(ENV)
    if spec and _matches(spec, ENV, point, step):
        os.kill(os.getpid(), signal.SIGKILL)
    spec = os.environ.get(SIGNAL_ENV)
    rank = os.environ.get(RANK_ENV)
    if rank is not None and os.environ.get("RANK", "0") != rank:
        spec = None
    if spec and (point, step) not in _signalled and _matches(spec, SIGNAL_ENV, point, step):
        _signalled.add((point, step))
        os.kill(os.getpid(), signal.SIGTERM)
    spec = os.environ.get(ENOSPC_ENV)
    if spec and not spec.isdigit():
        raise ValueError(f"{ENOSPC_ENV}={spec!r}: expected the step whose checkpoint write fails")
    if spec and point == "checkpoint" and int(spec) == step:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
