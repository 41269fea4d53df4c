"""Fault injection for the crash, preemption and disk-full tests.

``SEMRL_FAULT_KILL=POINT@STEP`` makes the process SIGKILL itself when it reaches ``POINT`` during
training step ``STEP`` (1-based); ``SEMRL_FAULT_SIGNAL=POINT@STEP[,POINT@STEP...]`` sends it SIGTERM
there once and goes on (a preemption); ``SEMRL_FAULT_CTRL_C=POINT@STEP[,...]`` sends SIGINT once to
its whole process group, as Ctrl-C in a terminal does (start the outermost process in a session of
its own: the group is everything that shares it); ``SEMRL_FAULT_ENOSPC=STEP`` makes writing the
checkpoint of step ``STEP`` fail as on a full disk; ``SEMRL_FAULT_HANG=POINT@STEP`` (``rollout`` or
``evaluate``) makes the engine stop making progress in that phase (``semrl.core.watchdog``). Points:
``load`` (the models loaded, before the run's signal handler; step 0), ``rollout`` (after
generation, before rewards), ``update`` (after the first backward, before the optimizer step),
``evaluate`` (the evaluation after step STEP; 0: before training) and ``checkpoint`` (model written
to the temporary directory, not yet renamed). Unset, each point costs a set lookup.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "SEMRL_FAULT_KILL"
SIGNAL_ENV = "SEMRL_FAULT_SIGNAL"
CTRL_C_ENV = "SEMRL_FAULT_CTRL_C"
ENOSPC_ENV = "SEMRL_FAULT_ENOSPC"
HANG_ENV = "SEMRL_FAULT_HANG"
RANK_ENV = "SEMRL_FAULT_RANK"  # with several processes: only this rank is signalled
POINTS = ("load", "rollout", "update", "evaluate", "checkpoint")


def _parse(spec: str, env: str) -> frozenset[tuple[str, int]]:
    """The (point, step) pairs of ``POINT@STEP[,POINT@STEP...]``."""
    pairs = set()
    for item in spec.split(","):
        name, _, at = item.partition("@")
        if name not in POINTS or not at.isdigit():
            raise ValueError(f"{env}={spec!r}: expected POINT@STEP with POINT one of {', '.join(POINTS)}")
        pairs.add((name, int(at)))
    return frozenset(pairs)


class Faults:
    """The faults a test asked for, read from the environment once (``Faults.from_env``); the run
    passes this object to every place that can fail (``at``).

    Attributes:
        kill: (point, step) pairs where the process SIGKILLs itself.
        terminate: (point, step) pairs where it sends itself SIGTERM, once each.
        interrupt: (point, step) pairs where it sends its process group SIGINT, once each.
        enospc_step: the step whose checkpoint write fails as on a full disk, or None.
        hang: (point, step) pairs whose engine stops making progress (``rollout``, ``evaluate``).
    """

    def __init__(
        self,
        kill: frozenset[tuple[str, int]] = frozenset(),
        terminate: frozenset[tuple[str, int]] = frozenset(),
        enospc_step: int | None = None,
        interrupt: frozenset[tuple[str, int]] = frozenset(),
        hang: frozenset[tuple[str, int]] = frozenset(),
    ) -> None:
        self.kill, self.terminate, self.enospc_step = kill, terminate, enospc_step
        self.interrupt, self.hang = interrupt, hang
        self._signalled: set[tuple[str, int]] = set()  # a point can be reached several times in a step

    @classmethod
    def from_env(cls) -> Faults:
        """The faults ``SEMRL_FAULT_*`` ask for in this process (none when they are unset)."""
        kill = _parse(os.environ[ENV], ENV) if os.environ.get(ENV) else frozenset()
        signal_spec = os.environ.get(SIGNAL_ENV)
        rank = os.environ.get(RANK_ENV)
        if rank is not None and os.environ.get("RANK", "0") != rank:
            signal_spec = None
        signalled = _parse(signal_spec, SIGNAL_ENV) if signal_spec else frozenset()
        enospc = os.environ.get(ENOSPC_ENV)
        if enospc and not enospc.isdigit():
            raise ValueError(f"{ENOSPC_ENV}={enospc!r}: expected the step whose checkpoint write fails")
        interrupt = _parse(os.environ[CTRL_C_ENV], CTRL_C_ENV) if os.environ.get(CTRL_C_ENV) else frozenset()
        hang = _parse(os.environ[HANG_ENV], HANG_ENV) if os.environ.get(HANG_ENV) else frozenset()
        return cls(kill, signalled, int(enospc) if enospc else None, interrupt, hang)

    def at(self, point: str, step: int) -> None:
        """The process reached ``point`` during training step ``step`` (1-based; ``evaluate``: the
        evaluation after it): fail there if asked to."""
        if (point, step) in self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if (point, step) in self.terminate and (point, step) not in self._signalled:
            self._signalled.add((point, step))
            os.kill(os.getpid(), signal.SIGTERM)
        if (point, step) in self.interrupt and (point, step) not in self._signalled:
            self._signalled.add((point, step))
            os.killpg(os.getpgrp(), signal.SIGINT)
        if point == "checkpoint" and step == self.enospc_step:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


NO_FAULTS = Faults()
