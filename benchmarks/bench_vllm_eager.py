"""vLLM compiled (its default) against ``rollout.vllm_enforce_eager=true`` on SmolLM2-135M (CPU), in one
run: the engine's start-up and its sampling at the demo's rollout shape and at 32 prompts.

    python benchmarks/bench_vllm_eager.py [--repeats 2]

Each engine starts in a fresh process (what a run pays: vLLM's start-up, and for the compiled engine
torch.compile with vLLM's compile cache as it finds it), the two modes alternated, ``--repeats``
times. A process samples 8 prompts x 8 and then 32 prompts x 8, up to 64 new tokens each, top-20
log-probs, temperature 1, twice each with the same seeds in both modes (the second call is the one
timed: the first one warms the shapes). Prints a Markdown table of medians and the eager / compiled ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tables import print_median_ratio_table

MODES = ("compiled", "eager")
SHAPES = {"8 prompts x 8": 8, "32 prompts x 8": 32}


def child(mode: str) -> dict[str, float]:
    import torch

    from semrl.config.load import load_config
    from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
    from semrl.rollout.engines import GenerationRequest, SamplingParams, build_engine

    path = resolve_model_path("smollm2-135m")
    tok, model = load_tokenizer(path), load_model(path)
    options = load_config(None, [f"rollout.vllm_enforce_eager={str(mode == 'eager').lower()}"]).rollout
    start = time.perf_counter()
    engine = build_engine("vllm", model, tok, 256, 256, logprobs_top_k=20, vllm_options=options)
    times = {"start-up (s)": time.perf_counter() - start}
    params = SamplingParams(temperature=1.0, max_new_tokens=64, logprobs_top_k=20)
    for name, prompts in SHAPES.items():
        requests = [
            GenerationRequest(tok(f"Question {i}: what is {i} + {2 * i}?")["input_ids"])
            for i in range(prompts)
            for _ in range(8)
        ]
        for call in range(2):
            start = time.perf_counter()
            engine.generate(requests, params, torch.Generator().manual_seed(call))
            times[f"{name} (s)"] = time.perf_counter() - start
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child)))
        return
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        order = MODES if repeat % 2 == 0 else MODES[::-1]
        for mode in order:
            run = subprocess.run(
                [sys.executable, __file__, "--child", mode],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parents[1],
            )
            lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
            if run.returncode or not lines:
                sys.exit(f"the {mode} engine failed:\n{run.stderr[-3000:]}")
            results[mode].append(json.loads(lines[-1].removeprefix("RESULT ")))
            print(f"repeat {repeat}, {mode}: {results[mode][-1]}", flush=True)
    print()
    print_median_ratio_table(results, "compiled", "eager", digits=1)


if __name__ == "__main__":
    main()
