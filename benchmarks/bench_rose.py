"""ROSE tree rollout vs independent sampling on SmolLM2-135M (CPU), same prompts and seeds.

    python benchmarks/bench_rose.py [--config configs/demo.yaml] [--seeds 0 1 2] [--epsilon 0.5]

For each seed: G independent samples per prompt (one batched call), the ROSE tree rollout of G
leaves per prompt reusing the parent's KV cache, and the same tree rollout re-encoding prompt +
prefix. Prints a Markdown table of wall time, generated tokens, generation rounds and the share of
rollout time spent on branching scores, with ratios to independent sampling.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from semrl.config.load import load_config
from semrl.data import build_prompt_ids, make_arithmetic_problems
from semrl.methods.interface import RolloutContext
from semrl.methods.registry import MethodConfig
from semrl.methods.rose.branching import normalized_embeddings
from semrl.methods.rose.rollout import tree_rollout
from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
from semrl.rollout.engines import GenerationRequest, SamplingParams
from semrl.rollout.engines.hf import HFEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epsilon", type=float, default=0.5)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the config's")
    parser.add_argument("--prompts", type=int, default=None, help="default: rollout.prompts_per_step")
    parser.add_argument("--generation-batch-size", type=int, default=None, help="default: the config's")
    args = parser.parse_args()
    cfg = load_config(args.config)
    r = cfg.rollout
    path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tok, model = load_tokenizer(path), load_model(path)
    engine = HFEngine(
        model, [tok.eos_token_id], tok.pad_token_id, args.generation_batch_size or r.generation_batch_size
    )
    params = SamplingParams(
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=args.max_new_tokens or r.max_new_tokens,
        logprobs_top_k=r.logprobs_top_k,
    )
    num_prompts = args.prompts or r.prompts_per_step
    problems = make_arithmetic_problems(num_prompts, cfg.data.arithmetic_levels, seed=123)
    prompts = [build_prompt_ids(tok, p.problem, cfg.data.system_prompt) for p in problems]
    emb = normalized_embeddings(model.get_input_embeddings().weight)
    engine.generate([GenerationRequest(prompts[0])], replace(params, max_new_tokens=4))  # warm-up

    variants = {
        "independent": None,
        "tree, KV reuse": replace(cfg.section("rose"), epsilon=args.epsilon, reuse_kv_cache=True),
        "tree, re-encode prefix": replace(cfg.section("rose"), epsilon=args.epsilon, reuse_kv_cache=False),
    }
    totals = {name: {"s": 0.0, "tokens": 0, "rounds": 0, "score_s": 0.0} for name in variants}
    for seed in args.seeds:
        for name, rose in variants.items():
            gen = torch.Generator().manual_seed(seed)
            start = time.perf_counter()
            if rose is None:
                reqs = [GenerationRequest(p) for p in prompts for _ in range(r.group_size)]
                tokens, rounds, score_s = (
                    sum(len(g.token_ids) for g in engine.generate(reqs, params, gen)),
                    1,
                    0.0,
                )
            else:
                result = tree_rollout(
                    RolloutContext(engine, params, gen, MethodConfig(rose, cfg.algorithm, r)), prompts, emb
                )
                tokens = sum(g.generated_tokens for g in result.groups)
                rounds, score_s = result.rounds, result.score_seconds
            elapsed = time.perf_counter() - start
            t = totals[name]
            t["s"] += elapsed
            t["tokens"] += tokens
            t["rounds"] += rounds
            t["score_s"] += score_s
            print(f"seed {seed} {name}: {elapsed:.1f} s, {tokens} tokens, {rounds} rounds", flush=True)

    n = len(args.seeds)
    base = totals["independent"]
    print(
        f"\n{num_prompts} prompts x G={r.group_size}, max_new_tokens={params.max_new_tokens}, "
        f"generation batch {engine.batch_size}, epsilon={args.epsilon}, seeds {args.seeds}, "
        f"torch threads {torch.get_num_threads()}\n"
    )
    print(
        "| rollout | wall s (mean) | time ratio | generated tokens | token ratio | rounds | branch-score time |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, t in totals.items():
        share = f"{100 * t['score_s'] / t['s']:.2f}%" if t["score_s"] else "-"
        print(
            f"| {name} | {t['s'] / n:.1f} | {t['s'] / base['s']:.2f} | {t['tokens'] / n:.0f} | "
            f"{t['tokens'] / base['tokens']:.2f} | {t['rounds'] / n:.1f} | {share} |"
        )


if __name__ == "__main__":
    main()
