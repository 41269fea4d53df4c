"""Tree rollouts side by side: one demo-sized rollout step of independent sampling, FR3E, TreePO, LATR
and ROSE on SmolLM2-135M, on the hf and vllm engines, the same prompts and seeds in one run.

    python benchmarks/bench_tree_rollouts.py [--engines hf vllm] [--seeds 0 1 2] [--config configs/demo.yaml]

Per method and engine, averaged over the seeds: rollout seconds per step, tokens sampled per leaf
(every token the engine sampled, shared prefixes once, over the trained responses), prefix tokens
reused per leaf (tokens of the trained responses, and of the prefixes they continue, that were not
sampled for them) and the ratio of sampled tokens to independent sampling's. Each method runs with
its registry rollout and its defaults, except the demo scalings of configs/treepo_demo.yaml (segments of
rollout.max_new_tokens / 4) and configs/latr_demo.yaml (the math scripts' thresholds, lookahead
[n/16, n/10, n/6], the lookahead phase ended by token n/2, eta 1). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from functools import partial

import torch

from semrl.config.load import load_config
from semrl.data import build_prompt_ids, make_arithmetic_problems
from semrl.methods.catalog import get_method
from semrl.methods.interface import RolloutContext
from semrl.methods.registry import load, method_config
from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
from semrl.rollout.engines import GenerationRequest, build_engine, sampling_params
from semrl.update.passes import with_sampling_entropy

METHODS = ["independent", "fr3e", "treepo", "latr", "rose"]


def _rollout(name, engine, cfg, prompts, model, tok, seed):  # noqa: ANN001, ANN202
    """(seconds, sampled tokens, trained-response tokens, prefix tokens the responses continue, leaves)."""
    generator = torch.Generator().manual_seed(seed)
    before = engine.generated_tokens
    t0 = time.perf_counter()
    if name == "independent":
        params = sampling_params(cfg.rollout, top_logprobs=False)
        requests = [GenerationRequest(p) for p in prompts for _ in range(cfg.rollout.group_size)]
        gens, prefixes = engine.generate(requests, params, generator), 0
    else:
        method = get_method(name)
        params = sampling_params(cfg.rollout, top_logprobs=method.reads_top_logprobs)
        entropy = partial(with_sampling_entropy, model, temperature=params.temperature,
                          compute_dtype=engine.compute_dtype)
        ctx = RolloutContext(engine, params, generator, method_config(cfg, method.section), entropy,
                             decode=partial(tok.decode, skip_special_tokens=True))
        out = load(method.rollout_fn)(ctx, prompts)
        gens = out.generations
        # FR3E trains continuations whose anchor prefix is part of their prompt
        prefixes = sum(len(s) - len(prompts[i // cfg.rollout.group_size])
                       for i, s in enumerate(out.sequence_prompt_ids or []))
    seconds = time.perf_counter() - t0
    return seconds, engine.generated_tokens - before, sum(len(g.token_ids) for g in gens), prefixes, len(gens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    n = load_config(args.config).rollout.max_new_tokens
    segment = n // 4
    cfg = load_config(args.config, [
        f"treepo.segment_length={segment}", "latr.tau_abs=0.15", "latr.tau_rel=0.25", "latr.edit_distance_threshold=null",
        "latr.suffix_match_threshold=0.2", "latr.rouge_l_threshold=0.5", f"latr.lookahead=[{n // 16},{n // 10},{n // 6}]",
        f"latr.force_return_step={n // 2}", "latr.return_threshold_decay=0.05",
    ])
    path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tok, model = load_tokenizer(path), load_model(path)
    problems = make_arithmetic_problems(cfg.rollout.prompts_per_step, cfg.data.arithmetic_levels, seed=123)
    prompts = [build_prompt_ids(tok, p.problem, cfg.data.system_prompt) for p in problems]
    rows = []
    for kind in args.engines:
        engine = build_engine(kind, model, tok, cfg.rollout.generation_batch_size,
                              cfg.data.max_prompt_length + cfg.rollout.max_new_tokens, cfg.rollout.logprobs_top_k,
                              vllm_options=cfg.rollout)
        engine.generate([GenerationRequest(prompts[0])], replace(sampling_params(cfg.rollout, top_logprobs=False),
                                                                 max_new_tokens=4))  # warm-up
        results = {}
        for name in METHODS:
            runs = [_rollout(name, engine, cfg, prompts, model, tok, seed) for seed in args.seeds]
            seconds, sampled, trained, prefixes, leaves = (sum(col) / len(runs) for col in zip(*runs, strict=True))
            results[name] = (seconds, sampled / leaves, max(trained + prefixes - sampled, 0) / leaves, sampled)
            print(f"{kind} {name}: {seconds:.1f} s, {sampled / leaves:.1f} sampled tokens per leaf", flush=True)
        ref = results["independent"]
        for name, (seconds, per_leaf, reused, sampled) in results.items():
            rows.append(f"| {kind} | {name} | {seconds:.1f} | {seconds / ref[0]:.2f} | {per_leaf:.1f} | {reused:.1f} "
                        f"| {sampled / ref[3]:.2f} |")
    g, p, n = cfg.rollout.group_size, cfg.rollout.prompts_per_step, cfg.rollout.max_new_tokens
    print(f"\n{p} prompts x {g} leaves x {n} tokens, seeds {args.seeds}, torch threads {torch.get_num_threads()}, "
          f"TreePO segments of {segment} tokens\n")
    print("| engine | method | rollout s / step | x independent | sampled tokens / leaf | reused prefix tokens / leaf "
          "| sampled tokens x independent |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
