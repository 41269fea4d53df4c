"""What vLLM's start costs, and when compiled decoding repays its compile (issue 89, item 5).

Each mode starts vLLM in a fresh process (as ``semrl train`` does: the engine core in the process,
the demo's shape: SmolLM2-135M, 64 sequences of 64 new tokens), with vLLM's own INFO log, and
times: importing vLLM, ``LLM(...)`` (weight loading, compilation or the AOT cache, the profile run,
the KV cache, warm-up; vLLM's log lines give the parts), then ``--rollouts`` demo rollouts. The
modes: ``compiled`` (the default) with a cold compile cache (``--cold``: vLLM's and inductor's
caches moved to empty folders), ``compiled`` with the cache a previous start left, and ``eager``
(``rollout.vllm_enforce_eager``).

    python benchmarks/bench_vllm_start.py [--rollouts 3] [--modes compiled,eager] [--cold]

Prints one JSON line per mode and the steps after which compiled decoding has repaid its start.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, re, sys, time, logging
t0 = time.perf_counter()
import torch
from semrl.rollout.engines.vllm.start import import_vllm
os.environ["VLLM_LOGGING_LEVEL"] = "INFO"
vllm = import_vllm()
t_import = time.perf_counter() - t0
from semrl.models.loading import resolve_model_path
path = resolve_model_path("smollm2-135m")
eager = sys.argv[1] == "eager"
t1 = time.perf_counter()
llm = vllm.LLM(model=path, skip_tokenizer_init=True, dtype="float32", seed=0, enable_prefix_caching=True,
    block_size=32, max_model_len=640, max_num_seqs=64, max_num_batched_tokens=8192,
    logprobs_mode="processed_logprobs", max_logprobs=1, enforce_eager=eager,
    kv_cache_memory_bytes=1 << 30)
t_start = time.perf_counter() - t1
torch.set_num_threads(2)
params = vllm.SamplingParams(max_tokens=64, min_tokens=64, temperature=1.0, logprobs=0, seed=None)
prompts = [{"prompt_token_ids": list(range(100 + 3 * k, 180 + 3 * k))} for k in range(8) for _ in range(8)]
rollouts = []
for r in range(int(sys.argv[2])):
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    rollouts.append(time.perf_counter() - t)
    llm.reset_prefix_cache()
print("RESULT " + json.dumps({"import_s": t_import, "llm_s": t_start, "rollout_s": rollouts}))
"""

PATTERNS = {  # lines of vLLM 0.32's INFO log with the parts of its start, as it prints them
    "weights_s": r"Loading weights took ([\d.]+) seconds",
    "profile_run_s": r"Initial profiling/warmup run took ([\d.]+) s",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}
RECOMPILED = "Compiling model again due to a load failure"  # its AOT compile cache did not load


def run(mode: str, rollouts: int, env: dict[str, str], log_dir: Path | None = None) -> dict[str, object]:
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode.removesuffix("-cold"), str(rollouts)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    wall = time.perf_counter() - start
    text = out.stdout + out.stderr
    if log_dir is not None:
        (log_dir / f"{mode}.log").write_text(text)
    line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{mode} failed:\n{text[-3000:]}")
    result: dict[str, object] = {"mode": mode, "process_s": wall, **json.loads(line.removeprefix("RESULT "))}
    for key, pattern in PATTERNS.items():
        found = [float(x) for x in re.findall(pattern, text)]
        if found:
            result[key] = sum(found)
    result["compiled_again"] = RECOMPILED in text
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=3)
    parser.add_argument("--modes", default="compiled,eager")
    parser.add_argument(
        "--cold", action="store_true", help="first a compiled start with empty compile caches"
    )
    parser.add_argument("--log-dir", type=Path, help="write each start's whole output (vLLM's INFO log) here")
    args = parser.parse_args()
    env = dict(os.environ)
    modes = args.modes.split(",")
    results = []
    if args.cold:
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as inductor:
            cold = {**env, "VLLM_CACHE_ROOT": cache, "TORCHINDUCTOR_CACHE_DIR": inductor}
            results.append(run("compiled-cold", args.rollouts, cold, args.log_dir))
            print(json.dumps(results[-1]), flush=True)
    for mode in modes:
        results.append(run(mode, args.rollouts, env, args.log_dir))
        print(json.dumps(results[-1]), flush=True)
    by = {r["mode"]: r for r in results}
    if "compiled" in by and "eager" in by:
        c, e = by["compiled"], by["eager"]
        c_roll = sorted(c["rollout_s"])[len(c["rollout_s"]) // 2]  # type: ignore[arg-type]
        e_roll = sorted(e["rollout_s"])[len(e["rollout_s"]) // 2]  # type: ignore[arg-type]
        extra = float(c["process_s"]) - float(e["process_s"])  # type: ignore[arg-type]
        gain = e_roll - c_roll
        steps = extra / gain if gain > 0 else float("inf")
        print(
            f"compiled start costs {extra:.1f} s more (whole process, {args.rollouts} rollouts each); its "
            f"rollout is {c_roll:.2f} s against eager's {e_roll:.2f} s: repaid after {steps:.0f} steps"
        )


if __name__ == "__main__":
    main()
