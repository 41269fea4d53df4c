"""FR3E's entropy forward (issue 82, item 3), its two alternatives measured on the same chains.

    python benchmarks/bench_fr3e_entropy.py [prompts]

First-return chains of the demo's settings are sampled on vllm (SmolLM2-135M fp32), 3 seeds. Then:
one exact full-vocabulary entropy forward per chain (what FR3E's rollout runs as each chain comes
back) against one batched forward over the step's chains (which would make every continuation wait
for the last chain), with their times and whether the entropies are bit-identical; and how often the
anchors (3 per chain) chosen from the entropy of the engine's top-20 log-probs equal the exact
entropy's. Last, the entropy vLLM's sampler records as it samples (``GenerationRequest.entropy``,
docs/engines.md "Entropy on vllm"; FR3E's default since it was measured here), on 8 seeds: the same
chains sampled with and without recording, alternated (their times and whether their tokens are
equal), its largest difference from the forward's entropy and how often its anchors equal the
forward's.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from functools import partial

import torch
from demo_setup import config_engine

from semrl.config.load import load_config
from semrl.data import build_prompt_ids, make_arithmetic_problems
from semrl.methods.fr3e.method import select_anchors
from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
from semrl.rollout.engines import GenerationRequest, sampling_params
from semrl.update.row_logprobs import with_sampling_entropy

n = int(sys.argv[1]) if len(sys.argv) > 1 else 32
cfg = load_config("configs/demo.yaml", [f"rollout.prompts_per_step={n}"])
path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
tok, model = load_tokenizer(path), load_model(path)
problems = make_arithmetic_problems(n, cfg.data.arithmetic_levels, seed=123)
prompts = [build_prompt_ids(tok, p.problem, cfg.data.system_prompt) for p in problems]
engine = config_engine("vllm", model, tok, cfg, warm_up_prompt=prompts[0])
params = sampling_params(cfg.rollout, top_logprobs=False)
for seed in (0, 1, 2):
    gens = engine.generate(
        [GenerationRequest(p) for p in prompts], params, torch.Generator().manual_seed(seed)
    )
    ent = partial(
        with_sampling_entropy, model, temperature=params.temperature, compute_dtype=engine.compute_dtype
    )
    t0 = time.perf_counter()
    one = [ent([p], [g])[0] for p, g in zip(prompts, gens, strict=True)]
    t1 = time.perf_counter()
    batched = ent(prompts, gens)
    t2 = time.perf_counter()
    same = all(torch.equal(a.entropy, b.entropy) for a, b in zip(one, batched, strict=True))
    close = max((a.entropy - b.entropy).abs().max().item() for a, b in zip(one, batched, strict=True))
    print(
        f"{n} prompts seed {seed}: per chain {t1 - t0:.2f} s, batched {t2 - t1:.2f} s, ratio {(t2 - t1) / (t1 - t0):.2f}, bit-identical {same}, max diff {close:.2e}",
        flush=True,
    )

params_k = sampling_params(cfg.rollout, top_logprobs=True)
same_sets = total = 0
for seed in (0, 1, 2):
    gens = engine.generate(
        [GenerationRequest(p) for p in prompts], params_k, torch.Generator().manual_seed(seed)
    )
    full = ent(prompts, gens)
    for g in full:
        lp = g.top_logprobs.float()
        p = lp.exp()
        topk = -(p * lp).sum(-1)  # the top-k terms of the entropy sum, unrenormalized
        a, b = select_anchors(g.entropy, 3), select_anchors(topk, 3)
        same_sets += a == b
        total += 1
print(
    f"anchors from top-{params_k.logprobs_top_k} log-probs equal the exact entropy's on {same_sets} of {total} chains"
)

same_sets = total = same_tokens = 0
worst, seconds = 0.0, {"recording": 0.0, "not recording": 0.0}
for seed in range(8):
    for asks in (False, True):  # alternated
        t0 = time.perf_counter()
        gens = engine.generate(
            [GenerationRequest(p, entropy=asks) for p in prompts], params, torch.Generator().manual_seed(seed)
        )
        seconds["recording" if asks else "not recording"] += time.perf_counter() - t0
        if not asks:
            plain = gens
    same_tokens += all(torch.equal(a.token_ids, b.token_ids) for a, b in zip(gens, plain, strict=True))
    exact = ent(prompts, [replace(g, entropy=None) for g in gens])
    for g, e in zip(gens, exact, strict=True):
        assert g.entropy is not None and e.entropy is not None
        worst = max(worst, (g.entropy - e.entropy).abs().max().item())
        same_sets += select_anchors(g.entropy, 3) == select_anchors(e.entropy, 3)
        total += 1
print(
    f"sampler's entropy: anchors equal the forward's on {same_sets} of {total} chains, max diff {worst:.2e}; "
    f"tokens equal to unrecorded sampling on {same_tokens} of 8 seeds; sampling {seconds['recording']:.2f} s "
    f"recording, {seconds['not recording']:.2f} s not (8 calls each)"
)
