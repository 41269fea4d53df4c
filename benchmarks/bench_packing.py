"""Tree-packed vs padded forward+backward on real ROSE groups of SmolLM2-135M (CPU).

    python benchmarks/bench_packing.py [--config configs/rose_demo.yaml] [--prompts 2] [--repeats 3]

ROSE tree rollouts (the config's epsilon, G and token budget) give the groups. For each group the
loss over every chain's response log-probs is computed and back-propagated twice: G padded rows
(``semrl.update.forward``) and one packed row (``semrl.update.packing``), alternating, median of ``--repeats``.
Prints the share of unique tokens (packed / padded real tokens), both times, the time ratio, and
the goal ratio 1.05 x unique share. Then the memory of the attention structure (``TreeLayout``:
positions, segments, cutoffs and each query block's key indices) for one group at the ROSE
paper's size, S = 33,068 (a 300-token prompt and G = 8 chains of 4,096 tokens that share nothing,
the largest S), against the dense fp32 (S, S) mask it replaces.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from semrl.config.load import load_config
from semrl.data import build_prompt_ids, make_arithmetic_problems
from semrl.methods.interface import RolloutContext
from semrl.methods.registry import method_config
from semrl.methods.rose.branching import normalized_embeddings
from semrl.methods.rose.rollout import tree_rollout
from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
from semrl.rollout.engines import SamplingParams
from semrl.rollout.engines.hf import HFEngine
from semrl.rollout.sequences import make_sequence_batch
from semrl.rollout.tree import ChainTree
from semrl.update.forward import response_logprobs
from semrl.update.packing import pack_trees, packed_response_logprobs


def _time_backward(model: torch.nn.Module, fn, batch) -> float:  # noqa: ANN001
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    logp, _ = fn(model, batch, 1.0, with_entropy=False)
    (-logp.sum()).backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/rose_demo.yaml")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the config's")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cfg = load_config(args.config)
    r = cfg.rollout
    path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tok, model = load_tokenizer(path), load_model(path)
    engine = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, r.generation_batch_size)
    params = SamplingParams(r.temperature, r.top_p, r.top_k, args.max_new_tokens or r.max_new_tokens)
    problems = make_arithmetic_problems(args.prompts, cfg.data.arithmetic_levels, seed=123)
    prompts = [build_prompt_ids(tok, p.problem, cfg.data.system_prompt) for p in problems]
    emb = normalized_embeddings(model.get_input_embeddings().weight)
    gen = torch.Generator().manual_seed(args.seed)
    result = tree_rollout(RolloutContext(engine, params, gen, method_config(cfg, "rose")), prompts, emb)
    model.train()
    print(
        "| group | chains | padded tokens | unique tokens | unique share | padded s | packed s | ratio | goal |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ratios, shares = [], []
    for i, (prompt, group) in enumerate(zip(prompts, result.groups, strict=True)):
        responses = [g.token_ids.tolist() for g in group.generations]
        padded = make_sequence_batch([prompt] * len(responses), responses, tok.pad_token_id)
        packed = pack_trees([prompt], [responses], [group.tree], tok.pad_token_id)
        real = int(padded.attention_mask.sum())
        share = packed.packed_tokens / real
        times: dict[str, list[float]] = {"padded": [], "packed": []}
        _time_backward(model, packed_response_logprobs, packed)  # warm-up
        for _ in range(args.repeats):
            times["padded"].append(_time_backward(model, response_logprobs, padded))
            times["packed"].append(_time_backward(model, packed_response_logprobs, packed))
        t_pad, t_pack = statistics.median(times["padded"]), statistics.median(times["packed"])
        ratios.append(t_pack / t_pad)
        shares.append(share)
        print(
            f"| {i} | {len(responses)} | {real} | {packed.packed_tokens} | {share:.2f} | {t_pad:.2f} | {t_pack:.2f} "
            f"| **{t_pack / t_pad:.2f}** | <= {1.05 * share:.2f} |",
            flush=True,
        )
    print(f"\nmean time ratio {statistics.mean(ratios):.2f}, mean unique share {statistics.mean(shares):.2f}")
    paper = pack_trees(
        [[1] * 300], [[[2] * 4096] * 8], [ChainTree((-1,) * 8, (-1,) + (0,) * 7, (4096,) * 8)], 0
    )
    width = paper.input_ids.shape[1]
    print(
        f"attention structure at S = {width:,}: {paper.layout.structure_bytes() / 2**20:.1f} MiB "
        f"(dense fp32 mask: {width * width * 4 / 2**30:.2f} GiB)"
    )


if __name__ == "__main__":
    main()
