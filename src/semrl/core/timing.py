"""Wall seconds per named phase of a step, as verl's ``marked_timer`` times each stage.

The trainer gives the update a ``PhaseClock`` every step; the update and the trainer time their phases
on it (the no-gradient forwards, the update's forwards and backwards, the optimizer, the weight
sync), and the step logs them as ``time/update/<phase>_s`` beside ``time/update_s``, which they add up
to (docs/training.md, "Where a step's time goes").
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class PhaseClock:
    """Accumulates wall seconds per phase name.

    Args:
        synchronize: called at the start and end of every phase, so that asynchronous device work
            (CUDA) is counted in the phase that queued it; None on a CPU, where kernels run in order.
    """

    def __init__(self, synchronize: Callable[[], None] | None = None) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._synchronize = synchronize
        self._open: str | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` (added to what it already holds). Phases do not nest:
        a phase inside another would be counted twice in their sum."""
        if self._open is not None:
            raise RuntimeError(f"phase '{name}' started inside phase '{self._open}'; phases do not nest")
        if self._synchronize is not None:
            self._synchronize()
        self._open, start = name, time.perf_counter()
        try:
            yield
        finally:
            if self._synchronize is not None:
                self._synchronize()
            self.seconds[name] += time.perf_counter() - start
            self._open = None

    def metrics(self, prefix: str) -> dict[str, float]:
        """``{f"{prefix}/{name}_s": seconds}`` for every phase timed."""
        return {f"{prefix}/{name}_s": s for name, s in self.seconds.items()}


def device_synchronize(device_type: str) -> Callable[[], None] | None:
    """The synchronize a ``PhaseClock`` needs on ``device_type``: CUDA's, or None on a CPU."""
    if device_type != "cuda":
        return None
    import torch

    return torch.cuda.synchronize
