"""The hf and vllm engines side by side on SmolLM2-135M (CPU), in one run.

    python benchmarks/bench_engines.py [--config configs/demo.yaml] [--steps 2] [--sections rose eval ...]

1. Sampling throughput at 1, 8, 32 and 64 sequences (64 new tokens each, EOS ignored, top-20 log-probs).
2. ROSE tree rollout vs independent sampling of the same G x prompts, at 8 and 32 prompts.
3. Demo training steps (the config's, no evaluation) split into rollout / reward / update.
4. In-training evaluation: the demo's held-out mean@8 sampling (32 problems x 8).

Each section runs both engines back to back and prints a Markdown table with vllm / hf ratios.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from demo_setup import config_engine

from semrl.config.load import load_config
from semrl.data import PromptFormat, build_prompt_ids, make_arithmetic_problems
from semrl.evaluation import sample_and_verify
from semrl.methods.interface import RolloutContext
from semrl.methods.registry import MethodConfig
from semrl.methods.rose.branching import normalized_embeddings
from semrl.methods.rose.rollout import tree_rollout
from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
from semrl.reward import Judge, VerifierPool
from semrl.rollout.engines import GenerationRequest, SamplingParams

ENGINES = ("hf", "vllm")


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def throughput(
    engines: dict[str, Any], prompts: list[list[int]], sizes: list[int], new_tokens: int
) -> list[str]:
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    rows = []
    for n in sizes:
        reqs = [GenerationRequest(prompts[i % len(prompts)]) for i in range(n)]
        rates = {}
        for name, engine in engines.items():
            gens, seconds = _timed(
                lambda e=engine, q=reqs: e.generate(q, params, torch.Generator().manual_seed(0))
            )
            rates[name] = sum(len(g.token_ids) for g in gens) / seconds
        rows.append(f"| {n} | {rates['hf']:.1f} | {rates['vllm']:.1f} | {rates['vllm'] / rates['hf']:.2f}x |")
    return ["| sequences | hf tok/s | vllm tok/s | vllm / hf |", "|---|---|---|---|", *rows]


def rose_vs_independent(
    engines: dict[str, Any], tok: Any, model: Any, cfg: Any, prompt_counts: list[int], seeds: list[int]
) -> list[str]:
    r = cfg.rollout
    params = SamplingParams(
        temperature=r.temperature, max_new_tokens=r.max_new_tokens, logprobs_top_k=r.logprobs_top_k
    )
    emb = normalized_embeddings(model.get_input_embeddings().weight).cpu()
    rose = MethodConfig(replace(cfg.section("rose"), epsilon=0.5), cfg.algorithm, r)
    rows = []
    for count in prompt_counts:
        problems = make_arithmetic_problems(count, cfg.data.arithmetic_levels, seed=123)
        prompts = [build_prompt_ids(tok, p.problem, cfg.data.system_prompt) for p in problems]
        for name, engine in engines.items():
            indep = tree = 0.0
            tokens = [0, 0]
            for seed in seeds:
                reqs = [GenerationRequest(p) for p in prompts for _ in range(r.group_size)]
                gens, s = _timed(
                    lambda e=engine, q=reqs, sd=seed: e.generate(q, params, torch.Generator().manual_seed(sd))
                )
                indep += s
                tokens[0] += sum(len(g.token_ids) for g in gens)
                result, s = _timed(
                    lambda e=engine, sd=seed, ps=prompts: tree_rollout(
                        RolloutContext(e, params, torch.Generator().manual_seed(sd), rose), ps, emb
                    )
                )
                tree += s
                tokens[1] += sum(g.generated_tokens for g in result.groups)
            n = len(seeds)
            rows.append(
                f"| {count} | {name} | {indep / n:.1f} | {tree / n:.1f} | {tree / indep:.2f} | "
                f"{tokens[0] / n:.0f} | {tokens[1] / n:.0f} |"
            )
    return [
        "| prompts | engine | independent s | ROSE tree s | tree / independent | independent tokens | tree generated tokens |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]


def evaluation(engines: dict[str, Any], tok: Any, cfg: Any) -> list[str]:
    problems = make_arithmetic_problems(
        cfg.data.eval_size, cfg.data.arithmetic_levels, seed=cfg.trainer.seed + 10_007
    )
    params = SamplingParams(temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens)
    seconds = {}
    with VerifierPool.from_config(cfg.reward) as pool:
        for name, engine in engines.items():
            _, seconds[name] = _timed(
                lambda e=engine: sample_and_verify(
                    e,
                    tok,
                    problems,
                    params,
                    cfg.logging.eval_samples,
                    PromptFormat.of(cfg.data),
                    Judge(pool),
                    torch.Generator().manual_seed(1),
                )
            )
    return [
        "| held-out evaluation | hf s | vllm s | vllm / hf |",
        "|---|---|---|---|",
        f"| {len(problems)} problems x {cfg.logging.eval_samples} samples | {seconds['hf']:.1f} | {seconds['vllm']:.1f} | "
        f"{seconds['vllm'] / seconds['hf']:.2f} |",
    ]


def training_steps(config: str, steps: int) -> list[str]:
    from semrl.runtime.trainer import Trainer

    means = {}
    for name in ENGINES:
        with tempfile.TemporaryDirectory() as out:
            cfg = load_config(
                config,
                [
                    f"rollout.engine={name}",
                    "data.eval=null",
                    f"trainer.steps={steps}",
                    f"logging.output_dir={Path(out) / 'run'}",
                    "logging.progress=false",
                ],
            )
            Trainer(cfg).train()
            rows = [
                json.loads(line) for line in (Path(out) / "run" / "metrics.jsonl").read_text().splitlines()
            ]
        keys = ("time/rollout_s", "time/reward_s", "time/update_s", "time/step_s")
        means[name] = {k: sum(r[k] for r in rows) / len(rows) for k in keys}
        means[name]["reward"] = [round(r["reward"], 3) for r in rows]
    lines = ["| per step (mean s) | hf | vllm | vllm / hf |", "|---|---|---|---|"]
    for key in ("time/rollout_s", "time/reward_s", "time/update_s", "time/step_s"):
        h, v = means["hf"][key], means["vllm"][key]
        lines.append(f"| {key.removeprefix('time/').removesuffix('_s')} | {h:.1f} | {v:.1f} | {v / h:.2f} |")
    lines.append(f"\nrewards per step: hf {means['hf']['reward']}, vllm {means['vllm']['reward']}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--steps", type=int, default=2, help="training steps per engine")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument(
        "--sections",
        nargs="+",
        default=["throughput", "rose", "eval", "steps"],
        choices=["throughput", "rose", "eval", "steps"],
        help="which sections to run",
    )
    args = parser.parse_args()
    cfg = load_config(args.config)
    path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tok, model = load_tokenizer(path), load_model(path)
    engines = {name: config_engine(name, model, tok, cfg, batch_size=64) for name in ENGINES}
    problems = make_arithmetic_problems(64, cfg.data.arithmetic_levels, seed=7)
    prompts = [build_prompt_ids(tok, p.problem, cfg.data.system_prompt) for p in problems]
    for engine in engines.values():  # warm-up
        engine.generate([GenerationRequest(prompts[0])], SamplingParams(max_new_tokens=4))
    print(f"SmolLM2-135M fp32, torch threads {torch.get_num_threads()}\n")
    if "throughput" in args.sections:  # every sequence runs to its budget: no EOS here
        saved = engines["hf"].eos_token_ids, engines["vllm"].eos_token_ids
        engines["hf"].eos_token_ids, engines["vllm"].eos_token_ids = torch.tensor([-1]), []
        print("\n".join(throughput(engines, prompts, [1, 8, 32, 64], 64)), "\n", flush=True)
        engines["hf"].eos_token_ids, engines["vllm"].eos_token_ids = saved
    if "rose" in args.sections:
        print("\n".join(rose_vs_independent(engines, tok, model, cfg, [8, 32], args.seeds)), "\n", flush=True)
    if "eval" in args.sections:
        print("\n".join(evaluation(engines, tok, cfg)), "\n", flush=True)
    if "steps" in args.sections:
        print("\n".join(training_steps(args.config, args.steps)), flush=True)


if __name__ == "__main__":
    main()
