"""CPU threads that share a busy machine: OpenMP threads that sleep while they wait, and as many
torch threads as this process has cores.

torch's CPU kernels run on OpenMP threads, and libgomp by default lets a waiting thread spin. Alone
that costs nothing; beside another CPU-bound process a spinning thread burns the share of a core
that the thread it waits for needs. On 2 cores beside one CPU-bound process a demo-sized generation
took 3.0x its time alone with the default wait and 1.45x with a passive one (docs/benchmarks.md,
"A busy machine"). Neither setting changes a number the run computes.
"""

from __future__ import annotations

import os

WAIT_POLICY = "OMP_WAIT_POLICY"


def wait_passively() -> None:
    """``OMP_WAIT_POLICY=PASSIVE`` unless the user chose a policy. OpenMP reads it when it loads, so
    this runs before torch does (``import semrl``); the processes semrl starts inherit it."""
    os.environ.setdefault(WAIT_POLICY, "PASSIVE")


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or ``taskset`` may
    narrow below the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def torch_threads(configured: int | None, current: int) -> int | None:
    """The torch thread count to set: ``configured`` (``trainer.num_threads``) when given; else, when
    ``OMP_NUM_THREADS`` is unset, ``current`` (torch's default, the machine's cores) capped at
    ``available_cores()``; None to leave torch as it is."""
    if configured:
        return configured
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = available_cores()
    return cores if cores < current else None
