"""Deferred imports, so that reading a config answers before torch has loaded.

Importing torch takes about 1.6 s on a 2-core CPU (``benchmarks/bench_startup.py``). Checking a
config needs the method modules (their option classes and checks, ``semrl.configure``), and they
``import torch`` at the top, but no check runs tensor code. Inside ``deferred_imports("torch")``,
``import torch`` binds a stand-in module; the first attribute read on it (``torch.zeros``,
``import torch.nn``) imports the real module, so code that does need torch still gets it, only
later. ``Deferral.resolve`` imports the real modules and points every global that holds a stand-in
at them, so that a process which goes on to train holds only real modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


class DeferredModule(types.ModuleType):
    """Stands in ``sys.modules`` for a module not imported yet; reading an attribute imports it.

    Its ``__spec__`` and ``__file__`` are set, so the import system and tools that scan
    ``sys.modules`` can read them without importing the module.
    """

    def __getattr__(self, attr: str) -> Any:  # only reached for attributes not set on the stand-in
        return getattr(_load(self), attr)


def _load(stand_in: DeferredModule) -> types.ModuleType:
    """The real module behind ``stand_in``, imported if it is not yet."""
    if sys.modules.get(stand_in.__name__) is stand_in:
        del sys.modules[stand_in.__name__]
    module = importlib.import_module(stand_in.__name__)
    # globals still bound to the stand-in now find the real module's attributes without this hook
    stand_in.__dict__.update(module.__dict__)
    return module


@dataclass
class Deferral:
    """What ``deferred_imports`` put in place: the stand-ins by name, and the modules imported
    before the block (the others may hold stand-ins)."""

    stand_ins: dict[str, DeferredModule]
    modules_before: frozenset[str]

    def resolve(self) -> None:
        """Import the real modules behind the stand-ins and rebind every global of a module imported
        in the block that holds one (``import torch``, ``import numpy as np``) to its real module."""
        # only the modules imported since the block began can hold a stand-in: listed before the real
        # imports, which bring in their own submodules (torch: about a thousand)
        since = [
            module for name, module in sys.modules.items()
            if name not in self.modules_before
            and isinstance(module, types.ModuleType) and not isinstance(module, DeferredModule)
        ]
        real = {id(stand_in): _load(stand_in) for stand_in in self.stand_ins.values()}
        for module in since:
            namespace = vars(module)
            for key, value in list(namespace.items()):
                if id(value) in real and isinstance(value, DeferredModule):
                    namespace[key] = real[id(value)]


@contextmanager
def deferred_imports(*names: str) -> Iterator[Deferral]:
    """Within the block, ``import <name>`` of a top-level module not yet imported binds a
    ``DeferredModule``. On leaving, the stand-ins leave ``sys.modules``, so a later ``import`` gets
    the real module. Globals bound to them inside the block keep them until ``Deferral.resolve``,
    and still work: the first attribute read imports the real module."""
    stand_ins: dict[str, DeferredModule] = {}
    modules_before = frozenset(sys.modules)
    for name in names:
        if "." in name:
            raise ValueError(f"deferred_imports takes top-level modules, got '{name}'")
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue  # not installed: the real import raises where it is written
        stand_in = DeferredModule(name)
        stand_in.__spec__ = spec
        stand_in.__loader__ = spec.loader
        stand_in.__file__ = spec.origin
        stand_in.__package__ = name
        stand_ins[name] = sys.modules[name] = stand_in
    try:
        yield Deferral(stand_ins, modules_before)
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
