"""The preloaded server that the multi-process tests fork their ``semrl`` commands from
(``tests.forked``) gives each rank what ``accelerate launch`` gives it, and ends like a process."""

from __future__ import annotations

import gc
import json
import os
import subprocess

import pytest

from semrl.cli.train import accelerate_launch, free_port
from tests.forked import UNSET_BY_FORK, preloaded_server, rank_env, run_python, run_semrl

# each rank writes its own file: two ranks printing to one pipe can interleave their lines
_DUMP = """
import json, os, sys
before = json.loads(sys.argv[1])
changed = {k: v for k, v in os.environ.items() if before.get(k) != v}
with open(os.path.join(sys.argv[2], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(changed, f)
"""


@pytest.mark.e2e  # starts processes
def test_each_forked_rank_gets_the_environment_accelerate_launch_gives_it(tmp_path):
    script = tmp_path / "dump_env.py"
    script.write_text(_DUMP)
    port = free_port()
    launch = subprocess.run(  # the command `semrl train --num-processes 2` runs, with a script
        [*accelerate_launch(2, str(port)), str(script), json.dumps(dict(os.environ)), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert launch.returncode == 0, launch.stderr[-2000:]
    launched = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("*.json"))]
    assert len(launched) == 2
    for real in launched:
        rank = int(real["RANK"])
        forked = rank_env(rank, 2, port)
        for key in UNSET_BY_FORK:
            real.pop(key, None)
        # torchrun's agent holds the store there; the forked ranks have no agent, and rank 0 holds it
        assert real.pop("TORCHELASTIC_USE_AGENT_STORE") == "True"
        assert forked.pop("TORCHELASTIC_USE_AGENT_STORE") == "False"
        real.pop("OMP_NUM_THREADS", None)  # torchrun's, and the preloaded server's: 1
        assert forked == real


@pytest.mark.e2e  # starts processes
def test_a_forked_command_ends_with_its_status_and_its_output(tmp_path):
    bad = run_semrl("train", "trainer.stpes=3")
    assert bad.returncode == 2 and "trainer.stpes" in bad.stderr and bad.stdout == ""
    ok = run_semrl("config", "trainer")
    assert ok.returncode == 0 and "micro_batch_size" in ok.stdout, ok.stderr
    script = run_python("import sys; print(sys.argv, __name__); sys.exit(int(sys.argv[1]))", "3")
    assert script.returncode == 3 and script.stdout == "['-c', '3'] __main__\n"
    raised = run_python("raise ValueError('boom')")
    assert raised.returncode == 1 and "ValueError: boom" in raised.stderr
    # torch reads OMP_NUM_THREADS at import: another value needs a server that imported with it,
    # and the first one stays for the commands after it
    server = preloaded_server()
    first = server.pid
    assert run_semrl("config", "trainer").returncode == 0 and server.pid == first
    two_threads = {**os.environ, "OMP_NUM_THREADS": "2"}
    assert run_semrl("config", "trainer", env=two_threads).returncode == 0
    other = preloaded_server(env=two_threads)
    assert other is not server and other.pid not in (None, first)
    assert run_semrl("config", "trainer").returncode == 0 and server.pid == first


def test_the_workers_imports_are_frozen_and_its_collector_runs():
    """conftest freezes what the imports and the collection keep before the first test, and turns the
    collector it held off during them on again: a full collection walks only the tests' objects."""
    assert gc.isenabled()
    assert gc.get_freeze_count() > 100_000


@pytest.mark.e2e  # starts processes
def test_a_fork_finds_the_servers_imports_frozen_and_its_collector_on():
    """The preloaded server freezes what its imports keep before it forks a command
    (tests.forked.serve): the fork's full collections walk only the objects of its own command."""
    run = run_python("import gc; print(gc.get_freeze_count(), gc.isenabled())")
    assert run.returncode == 0, run.stderr[-2000:]
    frozen, enabled = run.stdout.split()
    assert int(frozen) > 100_000 and enabled == "True", run.stdout
