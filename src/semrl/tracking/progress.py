"""Progress as a run shows it (``logging.progress``): a live bar where stderr is a terminal, one plain
INFO line per step and per evaluation where no bar can draw (CI logs, ``docker exec``, a file),
nothing when it is off.

A bar gives no time estimate until a share of its work is done: an evaluation counts a sample when
it stops, and most stop late, at the token cap, so an early rate says nothing about the rest.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm.auto import tqdm

# the share of a bar's total done before it shows a rate and a time left
EVIDENCE = 0.25
_NO_ESTIMATE = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}]"


def can_draw() -> bool:
    """Whether a live bar can draw: stderr is a terminal."""
    return sys.stderr.isatty()


class Progress:
    """A tqdm bar that shows its estimate only after ``EVIDENCE`` of ``total`` is done, drawn only
    where ``can_draw``; ``plain`` tells the caller to log a line instead (enabled, no terminal)."""

    def __init__(
        self, total: int, desc: str, unit: str, enabled: bool, initial: int = 0, leave: bool = True
    ) -> None:
        self.plain = enabled and not can_draw()
        self.started = time.monotonic()
        self.bar = tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit=unit,
            leave=leave,
            disable=not enabled or self.plain,
            dynamic_ncols=True,
            bar_format=_NO_ESTIMATE,
        )
        self._estimate_from = initial + EVIDENCE * max(total - initial, 0)

    def update(self, n: int = 1) -> Any:
        self.bar.update(n)
        if self.bar.disable:  # a disabled bar keeps no format
            return None
        if self.bar.bar_format is not None and self.bar.n >= self._estimate_from:
            self.bar.bar_format = None  # tqdm's own format, with the rate and the time left
        return None

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def step_line(metrics: dict[str, Any], steps: int) -> str:
    """The plain line of a finished step: reward, accuracy, length, seconds, held-out mean@k."""
    line = (
        f"step {int(metrics['step'])}/{steps}: reward {metrics.get('reward', 0.0):.3f}, "
        f"accuracy {metrics.get('accuracy', 0.0):.3f}, length {metrics.get('response_length', 0.0):.1f}, "
        f"{metrics.get('time/step_s', 0.0):.1f} s"
    )
    held_out = next((k for k in metrics if k.startswith("eval/mean@")), None)
    return line + (f", held-out {held_out[5:]} {metrics[held_out]:.3f}" if held_out else "")
