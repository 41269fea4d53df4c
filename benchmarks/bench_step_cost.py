"""What one engine step costs at each running batch: the floor under a tree rollout's wall time.

    python benchmarks/bench_step_cost.py [--engine vllm] [--batches 1 8 16 24 32 40 48 57 64] [--repeats 3]

A tree rollout samples fewer tokens than independent sampling, but when its critical path is as long
as a response (TreePO at the demo shape: 64 engine steps, like independent sampling), its wall time
can fall below independent sampling's only as far as a step with fewer sequences is cheaper. This
measures that: b distinct demo prompts, one sample each, the demo's sampling and 64 new tokens, for
each b, the batches alternated within each repeat (so a drift of the machine hits them alike). Per
call: seconds, the engine's forward passes and their mean running batch (``EngineCost``). It fits
seconds per step = a + c x running batch over every call (least squares). A second series prices a
context token: b new prompts (never seen, so nothing is cached but the shared template) with one new
token each, priced as p = (seconds - a x steps - c x running rows) / prefill tokens. On vllm it then
prints, for the demo's tree rollouts (docs/benchmarks.md, "Tree rollouts side by side"), the
wall-time ratio to independent sampling that their steps, running batch and prefill give at these
prices: with the prefill (the model) and without it (the floor if nothing were recomputed). Prints
Markdown tables.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import numpy as np
import torch
from demo_setup import config_engine

from semrl.config.load import load_config
from semrl.data import build_prompt_ids, make_arithmetic_problems
from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
from semrl.rollout.engines import GenerationRequest, sampling_params

# (method, engine steps per rollout step, mean running batch, prefill tokens per leaf, wall-time ratio
# to independent sampling) of the demo shape on vllm, measured on 2026-11-27 (docs/benchmarks.md,
# "Tree rollouts side by side"); independent sampling first
DEMO_TREES = [
    ("independent", 64, 57.0, 8.2, 1.00),
    ("treepo", 64, 40.5, 41.0, 1.02),
    ("treepo-aligned", 153, 19.9, 4.5, 1.31),
    ("fr3e", 128, 21.4, 13.2, 1.39),
    ("latr", 64, 46.3, 19.2, 1.28),
    ("rose", 221, 11.8, 12.3, 1.53),
]
LEAVES = 64  # the demo's 8 prompts x 8 leaves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--engine", default="vllm", choices=["hf", "vllm"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 24, 32, 40, 48, 57, 64])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cfg = load_config(args.config)
    path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tok, model = load_tokenizer(path), load_model(path)
    problems = make_arithmetic_problems(max(args.batches), cfg.data.arithmetic_levels, seed=321)
    prompts = [build_prompt_ids(tok, p.problem, cfg.data.system_prompt) for p in problems]
    engine = config_engine(args.engine, model, tok, cfg, warm_up_prompt=prompts[0])
    params = sampling_params(cfg.rollout, top_logprobs=False)
    calls: dict[int, list[tuple[float, int, float]]] = {b: [] for b in args.batches}
    for repeat in range(args.repeats):
        for b in args.batches:
            before = engine.cost.snapshot()
            t0 = time.perf_counter()
            engine.generate(
                [GenerationRequest(p) for p in prompts[:b]], params, torch.Generator().manual_seed(repeat)
            )
            seconds = time.perf_counter() - t0
            cost = engine.cost.since(before)
            calls[b].append((seconds, cost.engine_steps, cost.mean_running_batch))
            print(
                f"repeat {repeat} batch {b}: {seconds:.2f} s, {cost.engine_steps} steps, "
                f"running batch {cost.mean_running_batch:.1f}",
                flush=True,
            )
    prefill: list[tuple[float, int, int, int]] = []  # (seconds, steps, running rows, prefill tokens)
    fresh = make_arithmetic_problems(104 * args.repeats, [1, 2, 3], seed=654)  # level 1 has 100
    fresh_prompts = [build_prompt_ids(tok, p.problem, cfg.data.system_prompt) for p in fresh]
    one_token = replace(params, max_new_tokens=1)
    for repeat in range(args.repeats):
        for b in (8, 32, 64):
            batch_prompts, fresh_prompts = fresh_prompts[:b], fresh_prompts[b:]
            before = engine.cost.snapshot()
            t0 = time.perf_counter()
            engine.generate(
                [GenerationRequest(p) for p in batch_prompts],
                one_token,
                torch.Generator().manual_seed(repeat),
            )
            cost = engine.cost.since(before)
            prefill.append(
                (time.perf_counter() - t0, cost.engine_steps, cost.running_rows, cost.prefill_tokens)
            )
            print(f"repeat {repeat} prefill of {b} prompts: {prefill[-1]}", flush=True)
    per_step = [(s / steps, batch) for runs in calls.values() for s, steps, batch in runs]
    y = np.array([p for p, _ in per_step])
    x = np.array([[1.0, batch] for _, batch in per_step])
    (a, c), *_ = np.linalg.lstsq(x, y, rcond=None)
    print(
        f"\n{args.engine}, {cfg.model.name}, {cfg.rollout.max_new_tokens} new tokens, "
        f"repeats {args.repeats} (alternated), torch threads {torch.get_num_threads()}\n"
    )
    print("| requests | engine steps | mean running batch | s / step (min-max) |")
    print("|---|---|---|---|")
    for b, runs in calls.items():
        steps = [r[1] for r in runs]
        rates = [r[0] / r[1] for r in runs]
        print(
            f"| {b} | {statistics.mean(steps):.0f} | {statistics.mean(r[2] for r in runs):.1f} "
            f"| {statistics.mean(rates):.4f} ({min(rates):.4f}-{max(rates):.4f}) |"
        )
    prices = [(s - a * steps - c * rows) / tokens for s, steps, rows, tokens in prefill]
    price = float(np.mean(prices))
    print(f"\nfit: s / step = {a:.4f} + {c:.5f} x running batch")
    print(
        f"a context token: {price * 1e3:.2f} ms ({min(prices) * 1e3:.2f}-{max(prices) * 1e3:.2f}, "
        f"{len(prices)} calls of 8-64 new prompts), against {c * 1e3:.2f} ms per running sequence a step"
    )

    def seconds(steps: float, batch: float, prefill_per_leaf: float) -> float:
        return steps * (a + c * batch) + price * prefill_per_leaf * LEAVES

    if args.engine != "vllm":  # the demo's steps, batches and ratios below are vllm's
        return
    base = seconds(*DEMO_TREES[0][1:4])
    print(
        "\n| demo rollout (vllm) | engine steps | mean running batch | prefill tokens / leaf "
        "| floor x independent (no recompute) | model x independent (with prefill) | measured x independent |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, steps, batch, leaf_prefill, measured in DEMO_TREES:
        floor = seconds(steps, batch, DEMO_TREES[0][3]) / base
        model_ratio = seconds(steps, batch, leaf_prefill) / base
        print(
            f"| {name} | {steps} | {batch} | {leaf_prefill} | {floor:.2f} | {model_ratio:.2f} | {measured:.2f} |"
        )


if __name__ == "__main__":
    main()
