"""One training step at the papers' scale on one GPU: a Qwen2.5-1.5B-shaped model (random weights),
G = 8 chains of 4,096 response tokens after a 300-token prompt, bf16 compute over fp32 master weights.

    python benchmarks/bench_scale_step.py [--response 4096] [--chains 8] [--micro-batch-tokens 17600]

semrl's own update path (``micro_batches`` by a token budget, ``rows_logprobs`` through the chunked
LM head under autocast, ``micro_batch_loss`` with GRPO's PPO-clip loss, ``guarded_step``), gradient
checkpointing on. Prints peak GPU memory, tokens/s and MFU (model FLOPs 6N + causal attention, over
the GPU's dense bf16 peak), then the same update at lr 1e-6 from the same weights three ways: fp32
compute (reference), bf16 compute over fp32 master weights, and pure bf16 parameters: the share of
weights each moves, and each one's distance to the reference update.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from semrl.config.load import load_config
from semrl.data import Problem
from semrl.methods.catalog import get_policy_loss
from semrl.methods.policy_loss import PolicyLossInputs, micro_batch_loss
from semrl.methods.registry import load, method_config
from semrl.models.precision import Precision
from semrl.rollout.batch import RolloutBatch
from semrl.rollout.engines import Generation
from semrl.update.micro_batches import micro_batches
from semrl.update.optim import guarded_step
from semrl.update.row_logprobs import rows_logprobs

# Qwen2.5-1.5B's shape (its config.json on the hub)
QWEN25_15B = dict(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1e6,
    tie_word_embeddings=True,
)
# dense bf16 peak, TFLOP/s, by device name
PEAKS = {"H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H200": 989.4, "A100": 312.0}


class _Procs:  # one process
    world = 1

    def sum_gradients(self, parameters: object) -> None: ...
    def scalar(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def all_true(self, flag: bool) -> bool:
        return flag


def synthetic_batch(chains: int, prompt: int, response: int, vocab: int, seed: int = 0) -> RolloutBatch:
    gen = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(0, vocab, (prompt,), generator=gen).tolist()
    generations = []
    for _ in range(chains):
        tokens = torch.randint(0, vocab, (response,), generator=gen)
        generations.append(
            Generation(tokens, torch.zeros(response), torch.zeros(response, 1), tokens[:, None], None, True)
        )
    return RolloutBatch(
        [Problem("p", "q", "1")] * chains, [prompt_ids] * chains, generations, [""] * chains, chains, 0
    )


def train_step(model, batch, advantages, precision, cfg, lr, budget):  # noqa: ANN001, ANN201
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    scaler = precision.grad_scaler(torch.device("cuda"))
    rows = torch.arange(len(batch.generations))
    plan = micro_batches(batch, rows, 8, budget, packed=False)
    mask = batch.sequences.response_mask
    num_tokens = int(mask.sum())
    loss_fn = load(get_policy_loss("ppo").loss_fn)
    model.train()
    for positions in plan:
        idx = rows[positions]
        with precision.autocast(model):
            logp, entropy, m = rows_logprobs(
                model,
                batch,
                idx,
                1.0,
                with_entropy=True,
                packed=False,
                chunk_size=cfg.trainer.logits_chunk_size,
            )
        r = m.shape[1]
        x = PolicyLossInputs(
            logp=logp,
            old_logp=logp.detach(),
            advantages=advantages[idx, :r].cuda(),
            mask=m,
            entropy=entropy,
            ref_logp=None,
            num_tokens=num_tokens,
            num_micro_batches=len(plan),
        )
        loss, _, _ = micro_batch_loss(loss_fn, x, method_config(cfg, None), len(rows))
        scaler.scale(loss).backward()
    guarded_step(model, optimizer, scheduler, _Procs(), 1.0, False, [0.0], scaler)
    return len(plan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--response", type=int, default=4096)
    parser.add_argument("--micro-batch-tokens", type=int, default=17600)
    parser.add_argument("--layers", type=int, default=None, help="fewer layers, for a quick check")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = load_config(None, ["algorithm.method=grpo", "model.dtype=bfloat16"])
    shape = {**QWEN25_15B, **({"num_hidden_layers": args.layers} if args.layers else {})}
    config = Qwen2Config(**shape, attn_implementation="sdpa")
    torch.manual_seed(0)
    start = Qwen2ForCausalLM(config).float()  # random weights, std 0.02
    n_params = sum(p.numel() for p in start.parameters())
    batch = synthetic_batch(args.chains, args.prompt, args.response, config.vocab_size)
    advantages = torch.randn(batch.sequences.response_mask.shape, generator=torch.Generator().manual_seed(1))
    tokens = args.chains * (args.prompt + args.response)
    device = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAKS.items() if k in device), None)
    print(
        f"device: {device}; model: {n_params / 1e9:.2f}B parameters, {config.num_hidden_layers} layers; "
        f"{args.chains} x ({args.prompt} + {args.response}) tokens; micro-batch budget {args.micro_batch_tokens} tokens"
    )

    bf16_master = Precision(torch.bfloat16, torch.float32)
    # the measured step: bf16 compute over fp32 master weights, lr 1e-6 (warm-up step first)
    for label in ("warm-up", "measured"):
        with torch.device("cuda"):
            model = Qwen2ForCausalLM(config).float()
        model.load_state_dict(start.state_dict())
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        n_micro = train_step(model, batch, advantages, bf16_master, cfg, 1e-6, args.micro_batch_tokens)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if label == "measured":
            seq = args.prompt + args.response
            flops_per_token = (
                6 * n_params + 6 * config.num_hidden_layers * config.hidden_size * seq
            )  # causal attention
            achieved = flops_per_token * tokens / seconds / 1e12
            print(
                f"step: {seconds:.2f} s, {n_micro} micro-batches, peak GPU memory "
                f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB, {tokens / seconds:,.0f} tokens/s, "
                f"{achieved:.0f} TFLOP/s model FLOPs" + (f", MFU {achieved / peak:.1%}" if peak else "")
            )
        del model
        torch.cuda.empty_cache()

    deltas = {}
    for name, precision in (
        ("fp32 compute, fp32 weights", Precision(torch.float32, torch.float32)),
        ("bf16 compute, fp32 master weights", bf16_master),
        ("bf16 parameters (model.master_weights=false)", Precision(torch.bfloat16, torch.bfloat16)),
    ):
        with torch.device("cuda"):
            model = Qwen2ForCausalLM(config).to(precision.params)
        model.load_state_dict(start.state_dict())
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        before = torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])
        train_step(model, batch, advantages, precision, cfg, 1e-6, args.micro_batch_tokens)
        after = torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])
        deltas[name] = after - before
        del model
        torch.cuda.empty_cache()
    reference = deltas["fp32 compute, fp32 weights"]
    print("| update at lr 1e-6 | weights moved | |update - fp32 update|_1 / |fp32 update|_1 |")
    print("|---|---|---|")
    for name, delta in deltas.items():
        distance = ((delta - reference).abs().sum() / reference.abs().sum()).item()
        print(f"| {name} | {(delta != 0).float().mean().item():.1%} | {distance:.3f} |")


if __name__ == "__main__":
    main()
