"""Foundation benchmark on SmolLM2-135M (CPU): sampling throughput, one demo training step split
into rollout / reward / update, and peak memory.

    python benchmarks/bench_foundation.py [--config configs/demo.yaml] [--batches 1 8 32]

Prints a Markdown table. Peak memory is the process's maximum resident set size.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time

import torch

from semrl.config.load import load_config
from semrl.data import build_prompt_ids, make_arithmetic_problems
from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
from semrl.rollout.engines import GenerationRequest, SamplingParams
from semrl.rollout.engines.hf import HFEngine
from semrl.runtime.trainer import Trainer


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def sampling_throughput(batches: list[int], max_new_tokens: int) -> list[tuple[int, int, float]]:
    path = resolve_model_path("smollm2-135m")
    tok, model = load_tokenizer(path), load_model(path)
    engine = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, batch_size=max(batches))
    problems = make_arithmetic_problems(max(batches), [1], seed=0)
    system = "Please reason step by step, and put your final answer within \\boxed{}."
    prompts = [build_prompt_ids(tok, p.problem, system) for p in problems]
    rows = []
    for b in batches:
        # a fixed budget with EOS disabled, so every batch size generates the same token count
        engine.eos_token_ids = torch.tensor([-1])
        reqs = [GenerationRequest(p) for p in prompts[:b]]
        start = time.perf_counter()
        gens = engine.generate(
            reqs, SamplingParams(max_new_tokens=max_new_tokens), torch.Generator().manual_seed(0)
        )
        dt = time.perf_counter() - start
        n = sum(len(g.token_ids) for g in gens)
        rows.append((b, n, n / dt))
    return rows


def training_step(config: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(
            config,
            [
                "trainer.steps=1",
                "data.eval=null",
                f"logging.output_dir={out}",
                "logging.progress=false",
                "logging.tensorboard=false",
            ],
        )
        metrics = Trainer(cfg).train()
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("\n| batch | tokens | tokens/s |\n|---|---|---|")
    for b, n, tps in sampling_throughput(args.batches, args.max_new_tokens):
        print(f"| {b} | {n} | {tps:.1f} |")
    m = training_step(args.config)
    print("\n| demo step | seconds |\n|---|---|")
    for key in ("time/rollout_s", "time/reward_s", "time/update_s", "time/step_s"):
        print(f"| {key.split('/')[1]} | {m[key]:.1f} |")
    print(f"\npeak RSS: {peak_rss_gib():.2f} GiB (target < 8 GB)")


if __name__ == "__main__":
    main()
