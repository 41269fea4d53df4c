"""vLLM engines in processes of their own: 2 ranks that each colocate an engine, and an engine
replaced inside one process. These tests start their own processes (forked from the test worker's
preloaded server that has imported vLLM, tests/forked.py), so they stay out of the vllm group
(tests/conftest.py): they need no engine of the worker's and run beside it, in a group of their own
that starts that server once."""

from __future__ import annotations

import pytest

from tests.helpers import vllm_or_skip

_REPLACE_ENGINE_SCRIPT = """
import gc, os, sys, weakref
import torch, torch.distributed as dist
from semrl.cli.train import free_port
if sys.argv[2] == "accelerate":  # a default group that exists before vLLM, as accelerate's does
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
from semrl.rollout.engines import GenerationRequest, SamplingParams, build_engine
from semrl.rollout.engines.vllm.start import shutdown_engines
from semrl.models.loading import load_model, load_tokenizer
from semrl.config.load import load_config
tok, model = load_tokenizer(sys.argv[1]), load_model(sys.argv[1])
eager = load_config(None, ["rollout.vllm_enforce_eager=true"]).rollout  # tests.helpers.eager_vllm
params, request = SamplingParams(max_new_tokens=4), [GenerationRequest([1, 2, 3])]
first = build_engine("vllm", model, tok, 4, 128, vllm_options=eager)
first.generate(request, params, torch.Generator().manual_seed(0))
def memory(worker):  # the engine's weights and KV cache, in vLLM's worker
    return [weakref.ref(worker.model_runner.model)] + [weakref.ref(t) for t in worker.model_runner.kv_caches]
held = first.llm.collective_rpc(memory)[0]
second = build_engine("vllm", model, tok, 8, 128, vllm_options=eager)  # does not fit in the first: replaces it
gc.collect()
print("FIRST_FREED", len(held) > 1 and all(ref() is None for ref in held))
second.generate(request, params, torch.Generator().manual_seed(0))
del second
shutdown_engines()
print("GROUP_KEPT", dist.is_initialized())
if dist.is_initialized():
    t = torch.ones(1)
    dist.all_reduce(t)
    print("COLLECTIVE", t.item())
"""


@pytest.mark.parametrize("group", ["accelerate", "vllm"])
def test_a_replaced_engine_is_shut_down_and_an_outside_process_group_survives(digit32_model_dir, group):
    """A vLLM engine replaced by a larger one is shut down: its weights and KV cache are freed even
    while the replaced engine object is still referenced (it would keep its memory); shutting engines down keeps
    a default process group that existed before them (accelerate's) usable, and removes vLLM's own."""
    vllm_or_skip()
    from tests.forked import run_python

    run = run_python(_REPLACE_ENGINE_SCRIPT, str(digit32_model_dir), group, flavour="vllm")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "FIRST_FREED True" in run.stdout, run.stdout[-1000:]
    if group == "accelerate":
        assert "GROUP_KEPT True" in run.stdout and "COLLECTIVE 1.0" in run.stdout, run.stdout[-1000:]
    else:
        assert "GROUP_KEPT False" in run.stdout, run.stdout[-1000:]


def test_two_processes_each_run_a_vllm_engine_and_match_one_process(digit32_model_dir, tmp_path):
    """Each of 2 gloo processes colocates its own vLLM engine (external launcher); with per-sequence
    seeds the 2-process run samples what the 1-process run samples and ends with its weights, with
    data parallelism and with FSDP (the engine then takes gathered full tensors; no second copy)."""
    vllm_or_skip()
    import os

    from tests.forked import preloaded_server
    from tests.helpers import (
        distributed_run_overrides,
        final_weights,
        read_metrics,
        train_in_subprocess,
        write_seven_task,
    )

    task = write_seven_task(tmp_path / "seven.jsonl")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {"one": (1, []), "two": (2, []), "fsdp": (2, ["trainer.fsdp=true"])}
    for name, (processes, extra) in runs.items():
        train_in_subprocess(
            *distributed_run_overrides(digit32_model_dir, task, tmp_path / name),
            "rollout.engine=vllm",
            *extra,
            "--num-processes",
            str(processes),
            env=env,
        )
    assert preloaded_server("vllm").pid is not None  # their ranks forked from the server with vLLM imported
    one = read_metrics(tmp_path / "one")[1:]
    w1 = final_weights(tmp_path / "one")
    for name in ("two", "fsdp"):
        assert [m["reward"] for m in one] == [m["reward"] for m in read_metrics(tmp_path / name)[1:]], name
        w2 = final_weights(tmp_path / name)
        assert w1.keys() == w2.keys()
        assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-4, name


_SAMPLER_CACHE_SCRIPT = """
import threading
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from vllm.v1.sample.ops.logprobs import batched_count_greater_than
print("COMPILED", len(_debug_get_cache_entry_list(batched_count_greater_than._torchdynamo_orig_callable.__code__)))
print("THREADS", threading.active_count())
"""


@pytest.mark.e2e  # starts a process
def test_forked_vllm_ranks_find_the_sampler_compiled_and_no_thread_lost():
    """The vLLM-flavoured preloaded server (tests/forked.py) compiles vLLM's sampler function once, so
    each forked rank skips that compile (about 1.6 s a rank), and the compile leaves the server with
    only its main thread (a fork copies only that one). A cold inductor disk cache, as on a fresh
    machine, compiles in a thread pool: run with a fresh TORCHINDUCTOR_CACHE_DIR to check that path."""
    vllm_or_skip()
    from tests.forked import run_python

    run = run_python(_SAMPLER_CACHE_SCRIPT, flavour="vllm")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "COMPILED 1" in run.stdout and "THREADS 1" in run.stdout, run.stdout[-1000:]


_COMPILED_START_SCRIPT = """
import os, sys
os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[2]  # read when inductor compiles
import torch
from torch._dynamo.utils import counters
from semrl.config.load import load_config
from semrl.models.loading import load_model, load_tokenizer
from semrl.rollout.engines import GenerationRequest, SamplingParams, build_engine
tok, model = load_tokenizer(sys.argv[1]), load_model(sys.argv[1])
# a fork inherits the server's counters, and the server compiled vLLM's sampler before forking: a miss
# when inductor's default disk cache is cold, as on a fresh machine. Count only this start's compiles
counters.clear()
compiled = load_config(None, []).rollout  # vLLM's default: torch.compile
engine = build_engine("vllm", model, tok, 4, 128, vllm_options=compiled)
out = engine.generate([GenerationRequest([1, 2, 3])], SamplingParams(max_new_tokens=4), torch.Generator().manual_seed(0))
print("EAGER", engine.llm.llm_engine.vllm_config.model_config.enforce_eager)
print("MISSES", counters["inductor"]["fxgraph_cache_miss"])
print("HITS", counters["inductor"]["fxgraph_cache_hit"])
from vllm.compilation.counter import compilation_counter
print("AOT_COMPILES", compilation_counter.num_aot_compiles)
print("TOKENS", out[0].token_ids.tolist())
"""


def test_a_second_compiled_start_loads_the_compile_cache(digit32_model_dir, tmp_path):
    """vLLM 0.32's default AOT cache never loaded beside torch 2.13, so every start compiled again
    (docs/engines.md, "Start-up"); with it off, vLLM compiles through torch.compile, whose graphs
    inductor caches: the second start of the same model and settings, in a new process, compiles
    nothing, loads what the first compiled, and samples the same tokens."""
    vllm_or_skip()
    from tests.forked import run_python

    runs = [
        run_python(_COMPILED_START_SCRIPT, str(digit32_model_dir), str(tmp_path), flavour="vllm")
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        assert "EAGER False" in run.stdout, run.stdout[-1000:]
    first, second = (
        dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line) for run in runs
    )
    assert int(first["MISSES"]) > 0, runs[0].stdout[-1000:]  # an empty cache: compiled
    # nothing compiled again: no inductor graph, and no ahead-of-time compile (vLLM 0.32's AOT cache
    # failed to load and compiled again, from inductor's cache but 70 s for SmolLM2)
    assert int(second["MISSES"]) == 0 and int(second["HITS"]) > 0, runs[1].stdout[-1000:]
    assert int(second["AOT_COMPILES"]) == 0, runs[1].stdout[-1000:]
    assert first["TOKENS"] == second["TOKENS"]
