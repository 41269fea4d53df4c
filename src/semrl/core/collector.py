"""Python's cyclic garbage collector and a process's heavy imports.

A full collection walks every object the collector tracks. ``import torch, transformers`` and
semrl's trainer leave about 385,000 of them in a process (700,000 with vLLM), so a full collection
costs 0.35-0.77 s on a 2-core Xeon; the imports themselves trigger 7 (0.6-0.9 s of a 5 s import),
and vLLM's engine start runs 3 more of its own. The modules, classes and functions those imports
keep live as long as the process. ``imports_collected_once`` holds the collector off while they
load, then collects once and freezes what survives (``gc.freeze``): later full collections walk
only what the run itself makes, as after vLLM's own start-up freeze (docs/benchmarks.md, "The
collector's share"). At exit the frozen objects are handed back to the collector: the interpreter's
last collection then frees them, and extensions that count their objects at exit (triton's
nanobind bindings) find none left over.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def imports_collected_once() -> Iterator[None]:
    """Hold the cyclic collector off for the block (its imports), then collect once, freeze what
    survives, and leave the collector as it was (on, unless the caller had turned it off). The
    frozen objects are unfrozen at exit."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        atexit.unregister(gc.unfreeze)  # once, however many blocks
        atexit.register(gc.unfreeze)
        if enabled:
            gc.enable()
