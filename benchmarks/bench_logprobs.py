"""Log-probs + entropies + loss of one micro-batch from the last hidden states: full logits vs
``semrl.update.lm_head.chunked_logprobs``, forward and backward, synthetic weights (CPU or GPU).

    python benchmarks/bench_logprobs.py [--tokens 4096] [--hidden 2560] [--vocab 151936] [--repeats 3]
    python benchmarks/bench_logprobs.py --tokens 35200 --only chunked --repeats 1   # 8 x 4,400

Each run is a fresh process (so its peak resident memory is its own), the variants alternating.
The loss is GRPO's PPO-clip loss with token-mean aggregation over the tokens' log-probs; the
entropies are computed too, as the training forward does. "Above inputs" is the peak minus the
memory held once the hidden states (M, H) and the LM head (V, H) exist; it includes their
gradients (the head's alone is V x H x 4 bytes).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

GIB = 2**30


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def run_once(variant: str, tokens: int, hidden: int, vocab: int, chunk: int, device: str) -> dict[str, float]:
    from semrl.methods.losses import aggregate_loss, ppo_clip_loss
    from semrl.update.lm_head import chunked_logprobs

    gen = torch.Generator().manual_seed(0)
    h = (torch.randn(tokens, hidden, generator=gen) * 0.5).to(device).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen) * 0.02).to(device).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=gen).to(device)
    adv = torch.randn(1, tokens, generator=gen).to(device)
    mask = torch.ones(1, tokens, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss()
    start = time.perf_counter()
    if variant == "full":
        logp_all = torch.log_softmax((h @ w.T).float(), dim=-1)
        logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    else:
        logp, entropy = chunked_logprobs(h, w, targets, chunk_size=chunk)
    logp = logp[None]
    token_loss, _ = ppo_clip_loss(logp, logp.detach(), adv, mask, 0.2, 0.2, 3.0)
    aggregate_loss(token_loss, mask, "token-mean").backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seconds = time.perf_counter() - start
    assert entropy is not None and torch.isfinite(w.grad).all()
    return {
        "seconds": seconds,
        "above_inputs_gib": (peak - base) / GIB,
        "gradients_gib": (h.numel() + w.numel()) * 4 / GIB,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--tokens", type=int, default=4096, help="tokens in the micro-batch (8 x 4,400 = 35,200)"
    )
    parser.add_argument("--hidden", type=int, default=2560)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["full", "chunked"], default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_once(args.child, args.tokens, args.hidden, args.vocab, args.chunk, args.device)))
        return
    variants = [args.only] if args.only else ["full", "chunked"]
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for variant in variants:  # alternating, a fresh process each
            cmd = [
                sys.executable,
                __file__,
                "--child",
                variant,
                "--tokens",
                str(args.tokens),
                "--hidden",
                str(args.hidden),
                "--vocab",
                str(args.vocab),
                "--chunk",
                str(args.chunk),
                "--device",
                args.device,
            ]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                print(
                    f"{variant}: failed ({out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode})"
                )
                continue
            results[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    logits_gib = args.tokens * args.vocab * 4 / GIB
    print(
        f"{args.tokens} tokens, hidden {args.hidden}, vocabulary {args.vocab}, chunk {args.chunk}, {args.device}; "
        f"full fp32 logits would be {logits_gib:.2f} GiB; head gradient {args.vocab * args.hidden * 4 / GIB:.2f} GiB"
    )
    print("| variant | runs | median s | peak above inputs (GiB) | of which the gradients (GiB) |")
    print("|---|---|---|---|---|")
    medians = {}
    for variant, runs in results.items():
        if not runs:
            continue
        medians[variant] = statistics.median(r["seconds"] for r in runs)
        peak = max(r["above_inputs_gib"] for r in runs)
        print(
            f"| {variant} | {len(runs)} | {medians[variant]:.2f} | {peak:.2f} | {runs[0]['gradients_gib']:.2f} |"
        )
    if len(medians) == 2:
        print(f"time ratio chunked / full: {medians['chunked'] / medians['full']:.2f}")


if __name__ == "__main__":
    main()
