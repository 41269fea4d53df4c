"""Tree rollouts side by side: one demo-sized rollout step of independent sampling, FR3E, TreePO, LATR
and ROSE on SmolLM2-135M, on the hf and vllm engines, the same prompts and seeds in one run.

    python benchmarks/bench_tree_rollouts.py [--engines hf vllm] [--seeds 0 1 2] [--config configs/demo.yaml]

The methods alternate within each seed (independent, FR3E, TreePO, TreePO aligned, LATR, LATR on the
model, ROSE, then the next seed), so a drift of the machine hits them alike. Per method and engine,
over the seeds: rollout seconds per step and its ratio to independent sampling's (mean, and min-max
of the per-seed ratios), tokens sampled per leaf, the sampled-token ratio, and the engine's cost
(``EngineCost``): prefill tokens computed per leaf (what a branch recomputes), forward passes and
the mean running batch, and on vllm the share of engine steps after which a request still waited for
a slot (the only steps whose order a priority could change; 0 on hf), the children forked from their
parent's KV and the finished requests not held for lack of hold budget (vllm's fork). Each method runs with its
registry rollout and its defaults, except the demo scalings of configs/treepo_demo.yaml (segments of
rollout.max_new_tokens / 4) and configs/latr_demo.yaml (the math scripts' thresholds, lookahead
[n/16, n/10, n/6], the lookahead phase ended by token n/2, eta 1). ``treepo-aligned`` is TreePO with
``treepo.segment_alignment=block``: segments of one KV block (rollout.vllm_block_size, 32), the
first shortened so that every branch recomputes one token. ``latr`` runs its lookahead as streamed
vLLM requests on vllm (``latr.lookahead_on=stream``, the default), ``latr-model`` on the training
model before one vLLM call (the official split); on hf both run it on the model. On vllm each tree
method also runs as ``<method>-plain`` with ``rollout.vllm_fork=false`` (vLLM's prefix cache alone,
docs/engines.md "Forks on vllm"), alternated with the forked one, and ``independent-forked`` samples
the same G leaves per prompt as children forked from one computation of the prompt (a one-token
request; its token is counted). ``fr3e-forward`` is FR3E with ``rollout.vllm_sampler_entropy=false``:
on vllm its anchors' entropy comes from a forward of the model after each chain instead of from
vLLM's sampler (docs/engines.md "Entropy on vllm"). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch
from demo_setup import config_engine

from semrl.config.load import load_config
from semrl.data import build_prompt_ids, make_arithmetic_problems
from semrl.methods.catalog import get_method
from semrl.methods.interface import RolloutContext
from semrl.methods.registry import load, method_config
from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
from semrl.rollout.engines import GenerationRequest, sampling_params
from semrl.rollout.tree_kit import TreeSampler
from semrl.update.row_logprobs import with_sampling_entropy

METHODS = ["independent", "fr3e", "fr3e-forward", "treepo", "treepo-aligned", "latr", "latr-model", "rose"]
PLAIN = "-plain"  # the same method on the vllm engine without the fork
FORWARD = "fr3e-forward"  # FR3E with its anchors' entropy from the trained model's forward on vllm


def _count_waiting(engine) -> list[int]:  # noqa: ANN001
    """On vllm: a counter of the engine steps after which a request still waited for a slot (what
    priority scheduling could reorder), read from the scheduler's waiting queue."""
    from semrl.rollout.engines.vllm.drive import scheduler_of

    core = engine.llm.llm_engine
    scheduler, step, waited = scheduler_of(core), core.step, [0]

    def counted_step():  # noqa: ANN202
        outputs = step()
        waited[0] += bool(len(scheduler.waiting))
        return outputs

    core.step = counted_step  # the instance's attribute: EngineCall.step calls core.step()
    return waited


def _rollout(name, engine, cfg, prompts, model, tok, seed, waited):  # noqa: ANN001, ANN202
    """(seconds, sampled tokens, trained-response tokens, prefix tokens the responses continue, leaves,
    the engine's cost, engine steps with a request waiting)."""
    generator = torch.Generator().manual_seed(seed)
    before, cost, waited_before = engine.generated_tokens, engine.cost.snapshot(), waited[0]
    t0 = time.perf_counter()
    if name == "independent":
        params = sampling_params(cfg.rollout, top_logprobs=False)
        requests = [GenerationRequest(p) for p in prompts for _ in range(cfg.rollout.group_size)]
        gens, prefixes = engine.generate(requests, params, generator), 0
    elif name == "independent-forked":
        gens, prefixes = _forked_independent(engine, cfg, prompts, generator), 0
    else:
        method = get_method(name.split("-")[0])
        params = sampling_params(cfg.rollout, top_logprobs=method.reads_top_logprobs)
        entropy = partial(
            with_sampling_entropy, model, temperature=params.temperature, compute_dtype=engine.compute_dtype
        )
        ctx = RolloutContext(
            engine,
            params,
            generator,
            method_config(cfg, method.section),
            entropy,
            decode=partial(tok.decode, skip_special_tokens=True),
        )
        out = load(method.rollout_fn)(ctx, prompts)
        gens = out.generations
        # FR3E trains continuations whose anchor prefix is part of their prompt
        prefixes = sum(
            len(s) - len(prompts[i // cfg.rollout.group_size])
            for i, s in enumerate(out.sequence_prompt_ids or [])
        )
    seconds = time.perf_counter() - t0
    trained = sum(len(g.token_ids) for g in gens)
    spent = engine.cost.since(cost)
    return (
        seconds,
        engine.generated_tokens - before,
        trained,
        prefixes,
        len(gens),
        spent,
        waited[0] - waited_before,
    )


def _forked_independent(engine, cfg, prompts, generator):  # noqa: ANN001, ANN202
    """G leaves per prompt, each a child at position 0 of a one-token request of the prompt: with the
    fork, the prompt is computed once and every leaf computes one context token."""
    params = sampling_params(cfg.rollout, top_logprobs=False)
    g = cfg.rollout.group_size
    kit = TreeSampler(engine, prompts, params, generator, None, reuse_kv_cache=True)

    def on_node(node):  # noqa: ANN001, ANN202
        return [] if node.index else [kit.trees[node.prompt].add(1 + i, node, 0, leaf=True) for i in range(g)]

    kit.run([tree.add(0, budget=1) for tree in kit.trees], on_node)
    return [tree.nodes[1 + i].out for tree in kit.trees for i in range(g)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the config's)")
    parser.add_argument(
        "--methods", nargs="+", default=METHODS, choices=METHODS, help="independent always runs"
    )
    parser.add_argument("--no-plain", action="store_true", help="on vllm, skip the runs without the fork")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for every method"
    )
    args = parser.parse_args()
    methods = ["independent", *[m for m in args.methods if m != "independent"]]
    n = load_config(args.config).rollout.max_new_tokens
    segment = n // 4
    overrides = [
        f"treepo.segment_length={segment}",
        "latr.tau_abs=0.15",
        "latr.tau_rel=0.25",
        "latr.edit_distance_threshold=null",
        "latr.suffix_match_threshold=0.2",
        "latr.rouge_l_threshold=0.5",
        f"latr.lookahead=[{n // 16},{n // 10},{n // 6}]",
        f"latr.force_return_step={n // 2}",
        "latr.return_threshold_decay=0.05",
        *([f"rollout.prompts_per_step={args.prompts}"] if args.prompts else []),
        *args.set,
    ]
    cfg = load_config(args.config, overrides)
    block = cfg.rollout.vllm_block_size
    aligned = load_config(
        args.config, [*overrides, "treepo.segment_alignment=block", f"treepo.segment_length={block}"]
    )
    on_model = load_config(args.config, [*overrides, "latr.lookahead_on=model"])
    forward = load_config(args.config, [*overrides, "rollout.vllm_sampler_entropy=false"])
    variants = {"treepo-aligned": aligned, "latr-model": on_model, FORWARD: forward}
    configs = {name: variants.get(name, cfg) for name in methods}
    configs["independent-forked"] = cfg
    path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tok, model = load_tokenizer(path), load_model(path)
    problems = make_arithmetic_problems(cfg.rollout.prompts_per_step, cfg.data.arithmetic_levels, seed=123)
    prompts = [build_prompt_ids(tok, p.problem, cfg.data.system_prompt) for p in problems]
    rows = []
    for kind in args.engines:
        engine = config_engine(kind, model, tok, cfg, warm_up_prompt=prompts[0])
        waited = _count_waiting(engine) if kind == "vllm" else [0]
        names = list(methods)
        engines = dict.fromkeys(names, engine)
        if kind == "vllm" and FORWARD in names:  # the same vLLM; the engine asks it to record nothing
            engines[FORWARD] = config_engine(kind, model, tok, forward)
        if kind == "vllm" and not args.no_plain:  # the same vLLM, its children without the fork
            plain = config_engine(
                kind, model, tok, load_config(args.config, [*overrides, "rollout.vllm_fork=false"])
            )
            names = ["independent", "independent-forked"]
            for name in methods[1:]:
                names += [name, name + PLAIN] if name != FORWARD else [name]
                engines[name + PLAIN], configs[name + PLAIN] = plain, configs[name]
            engines["independent-forked"] = engine
        runs: dict[str, list] = {name: [] for name in names}
        for seed in args.seeds:  # alternated: every method once per seed
            for name in names:
                method = name.removesuffix(PLAIN)
                runs[name].append(
                    _rollout(method, engines[name], configs[name], prompts, model, tok, seed, waited)
                )
                seconds, sampled, *_ = runs[name][-1]
                print(f"{kind} seed {seed} {name}: {seconds:.3f} s, {sampled} sampled tokens", flush=True)
        ref = runs["independent"]
        for name, method_runs in runs.items():
            ratios = [r[0] / i[0] for r, i in zip(method_runs, ref, strict=True)]
            token_ratios = [r[1] / i[1] for r, i in zip(method_runs, ref, strict=True)]
            leaves = sum(r[4] for r in method_runs)
            costs = [r[5] for r in method_runs]
            steps = sum(c.engine_steps for c in costs)
            rows.append(
                f"| {kind} | {name} | {statistics.mean(r[0] for r in method_runs):.2f} "
                f"| {statistics.mean(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
                f"| {sum(r[1] for r in method_runs) / leaves:.1f} | {statistics.mean(token_ratios):.2f} "
                f"| {sum(c.prefill_tokens for c in costs) / leaves:.1f} | {steps / len(costs):.0f} "
                f"| {sum(c.running_rows for c in costs) / max(1, steps):.1f} "
                f"| {100 * sum(r[6] for r in method_runs) / max(1, steps):.0f} "
                f"| {sum(c.forked_requests for c in costs) / len(costs):.0f} "
                f"| {sum(c.holds_refused for c in costs) / len(costs):.0f} |"
            )
    g, p, n = cfg.rollout.group_size, cfg.rollout.prompts_per_step, cfg.rollout.max_new_tokens
    print(
        f"\n{p} prompts x {g} leaves x {n} tokens, seeds {args.seeds} (n = {len(args.seeds)} per cell, "
        f"alternated), torch threads {torch.get_num_threads()}, TreePO segments of {segment} tokens, "
        f"aligned ones of {block}\n"
    )
    print(
        "| engine | method | rollout s / step | x independent (min-max) | sampled tokens / leaf "
        "| sampled tokens x independent | prefill tokens / leaf | engine steps / step | mean running batch "
        "| steps with a request waiting (%) | forked children / step | holds refused / step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
