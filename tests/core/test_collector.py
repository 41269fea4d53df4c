"""``imports_collected_once``: the collector held off for a block of imports, then one collection,
the survivors frozen and the collector as it was."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import pytest

from semrl.core.collector import imports_collected_once


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_block_runs_without_the_collector_then_garbage_goes_and_survivors_freeze(enabled_before):
    (gc.enable if enabled_before else gc.disable)()
    try:
        frozen_before = gc.get_freeze_count()
        with imports_collected_once():
            assert not gc.isenabled()
            garbage = _Node()
            dropped = weakref.ref(garbage)
            del garbage
            kept = [[] for _ in range(1_000)]  # lists the collector tracks
            assert dropped() is not None  # no collection ran inside
        assert dropped() is None  # collected once at the end
        assert gc.get_freeze_count() >= frozen_before + len(kept)
        assert gc.isenabled() is enabled_before
        # a block that raises still ends with the collection and the collector restored
        with pytest.raises(KeyError), imports_collected_once():
            raise KeyError("an import failed")
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()


_AT_EXIT = """
import atexit, gc
atexit.register(lambda: print("AT_EXIT", gc.get_freeze_count()))  # runs after the ones below
from semrl.core.collector import imports_collected_once
with imports_collected_once():
    import json
with imports_collected_once():
    import csv
print("FROZEN", gc.get_freeze_count() > 0)
"""


@pytest.mark.e2e  # starts a process
def test_the_frozen_objects_go_back_to_the_collector_at_exit():
    """So that the interpreter's last collection frees them: triton's bindings, frozen, print a
    'nanobind: leaked' report at every exit."""
    run = subprocess.run([sys.executable, "-c", _AT_EXIT], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["FROZEN", "True", "AT_EXIT", "0"], run.stdout
