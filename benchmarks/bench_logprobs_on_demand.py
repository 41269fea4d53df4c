"""Log-probs on demand on the vllm engine (SmolLM2-135M, CPU), in one run: rollout tokens per second
of the demo's batch (8 prompts x 8 samples, 64 new tokens, T = 1) and of ROSE's tree rollout.

    python benchmarks/bench_logprobs_on_demand.py [--repeats 3]

Variants, alternated ``--repeats`` times (median reported):
- ``before``: what every method asked for until now: the top-20 log-probs of every position, as
  vLLM's dict per token, read with a per-token Python loop (the previous ``_to_generation``,
  kept here as the reference).
- ``top-20 flat``: the top-20 in vLLM's flat format, read at once (what ROSE asks for now).
- ``sampled only``: the sampled token's log-prob only (what every other method asks for now).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from typing import Any

import torch
from demo_setup import config_engine

from semrl.config.load import load_config
from semrl.data import build_prompt_ids, make_arithmetic_problems
from semrl.methods.interface import RolloutContext
from semrl.methods.registry import MethodConfig
from semrl.methods.rose.branching import normalized_embeddings
from semrl.methods.rose.rollout import tree_rollout
from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
from semrl.rollout.engines import Generation, GenerationRequest, SamplingParams
from semrl.rollout.engines.vllm import VLLMEngine
from semrl.rollout.engines.vllm.drive import EngineCall


class DictLogprobsEngine(VLLMEngine):
    """The engine as it was: vLLM's per-token dicts, read token by token."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.__dict__.update(engine.__dict__)

    def _call(
        self,
        requests: Any,
        params: Any,
        generator: Any,
        on_done: Any,
        streaming: Any = None,
        reuse_kv_cache: bool = False,
    ) -> None:
        if requests:
            DictLogprobsCall(self, params, generator, on_done, streaming, reuse_kv_cache).run(requests)


class DictLogprobsCall(EngineCall[Any]):
    """A call that asks vLLM for its per-token dicts and reads them token by token."""

    def _prepare(self, request: GenerationRequest, params: SamplingParams) -> Any:
        request_id, prompt, sampling = super()._prepare(request, params)
        sampling.flat_logprobs = False
        return request_id, prompt, sampling

    def _to_generation(self, completion: Any, k: int) -> Generation:
        tokens = list(completion.token_ids)
        n = len(tokens)
        logprobs, top_lps, top_ids = (
            torch.zeros(n),
            torch.zeros((n, k)),
            torch.zeros((n, k), dtype=torch.long),
        )
        for t, (token, entries) in enumerate(zip(tokens, completion.logprobs, strict=True)):
            logprobs[t] = entries[token].logprob
            ranked = sorted(((v.rank, -v.logprob, tid) for tid, v in entries.items() if v.rank <= k))[:k]
            if len(ranked) < k:
                ranked = sorted((-v.logprob, -v.logprob, tid) for tid, v in entries.items())[:k]
            top_ids[t] = torch.tensor([tid for _, _, tid in ranked])
            top_lps[t] = torch.tensor([-neg for _, neg, _ in ranked])
        self.cost.sampled_tokens += n
        eos = self.engine.eos_token_ids
        finished = bool(n) and tokens[-1] in eos and completion.finish_reason == "stop"
        return Generation(torch.tensor(tokens), logprobs, top_lps, top_ids, None, finished)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", default="configs/demo.yaml")
    args = parser.parse_args()
    cfg = load_config(args.config, ["rollout.engine=vllm"])
    path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tok, model = load_tokenizer(path), load_model(path)
    r = cfg.rollout
    new = config_engine("vllm", model, tok, cfg)
    assert isinstance(new, VLLMEngine)
    old = DictLogprobsEngine(new)
    problems = make_arithmetic_problems(r.prompts_per_step, cfg.data.arithmetic_levels, seed=5)
    prompts = [build_prompt_ids(tok, p.problem, cfg.data.system_prompt) for p in problems]
    requests = [GenerationRequest(p) for p in prompts for _ in range(r.group_size)]
    emb = normalized_embeddings(model.get_input_embeddings().weight).cpu()
    top20 = SamplingParams(temperature=r.temperature, max_new_tokens=r.max_new_tokens, logprobs_top_k=20)
    sampled_only = replace(top20, logprobs_top_k=0)
    rose = replace(cfg.section("rose"), epsilon=0.5)

    def independent(engine: Any, params: SamplingParams, seed: int) -> int:
        return sum(
            len(g.token_ids) for g in engine.generate(requests, params, torch.Generator().manual_seed(seed))
        )

    def tree(engine: Any, params: SamplingParams, seed: int) -> int:
        gen = torch.Generator().manual_seed(seed)
        result = tree_rollout(
            RolloutContext(engine, params, gen, MethodConfig(rose, cfg.algorithm, r)), prompts, emb
        )
        return sum(g.generated_tokens for g in result.groups)

    variants = {
        "Dr.GRPO rollout (independent)": [
            ("before", old, top20, independent),
            ("top-20 flat", new, top20, independent),
            ("sampled only", new, sampled_only, independent),
        ],
        "ROSE tree rollout": [("before", old, top20, tree), ("top-20 flat", new, top20, tree)],
    }
    independent(new, sampled_only, 99)  # warm-up
    rates: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):
        for section, runs in variants.items():
            for name, engine, params, fn in runs:
                start = time.perf_counter()
                tokens = fn(engine, params, repeat)
                rates.setdefault((section, name), []).append(tokens / (time.perf_counter() - start))
    print("| rollout | variant | tok/s (median) | vs before |\n|---|---|---|---|")
    for section, runs in variants.items():
        base = statistics.median(rates[(section, "before")])
        for name, *_ in runs:
            rate = statistics.median(rates[(section, name)])
            print(f"| {section} | {name} | {rate:.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
