"""GPU check in one device call: what the CPU tests cannot reach, on the hf engine's training path.

    PYTHONPATH=src python benchmarks/gpu_check.py [--device cuda] [--model smollm2|tiny] [--json OUT]

1. **Tree attention on CUDA** (FlexAttention with a block mask, compiled) equals the padded dense
   forward: per-token log-probs, entropies and the gradient of a policy-gradient loss, fp32, on
   random prefix trees (branches at every depth, a one-token chain, a group of one chain).
2. **A bf16 step over fp32 master weights**: the forward and backward under bf16 autocast, an AdamW
   step on the fp32 weights: the loss is finite, the weights stay fp32 and move, and the bf16
   log-probs are within the expected distance of the fp32 ones.
3. **The chunked LM head** equals the full ``log_softmax`` in values and gradients (fp32 and bf16
   autocast), and its peak memory against the full logits is measured side by side.

Each check prints its figures and PASS or FAIL; the exit status is 1 if any failed. On a machine
without CUDA the same checks run on the CPU (tree attention then takes its blockwise CPU path, not
FlexAttention): a smoke test of the script, not the GPU check. The GPU machine lent for checks has
torch and transformers but no vLLM, so the vllm engine is not part of this check (docs/engines.md,
GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from semrl.rollout.sequences import make_sequence_batch
from semrl.rollout.tree import ChainTree
from semrl.update.forward import response_logprobs
from semrl.update.lm_head import chunked_logprobs
from semrl.update.packing import pack_trees, packed_response_logprobs


def _model(kind: str, device: torch.device) -> torch.nn.Module:
    """SmolLM2-135M when its package is installed (``--model smollm2``), else a random 4-layer Llama
    with SmolLM2's vocabulary and head dim 64 (no download either way)."""
    if kind == "smollm2":
        try:
            from semrl.models.loading import resolve_model_path

            path = resolve_model_path("smollm2-135m", None)
            return AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32, attn_implementation="sdpa"
            ).to(device)
        except Exception as err:  # noqa: BLE001 - fall back and say so
            print(f"SmolLM2 not available ({type(err).__name__}: {err}); using the random model", flush=True)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").to(
        device
    )


def _random_trees(seed: int, vocab: int, groups: int, chains: int, max_len: int):
    """Random prefix trees: each chain starts fresh or branches from an earlier one at any depth."""
    gen = torch.Generator().manual_seed(seed)
    prompts, responses, trees = [], [], []
    for b in range(groups):
        prompts.append(torch.randint(0, vocab, (8 + 5 * b,), generator=gen).tolist())
        rs: list[list[int]] = []
        parents, positions = [], []
        for c in range(chains):
            length = int(torch.randint(1, max_len + 1, (1,), generator=gen))
            if c == 0 or torch.rand((), generator=gen) < 0.3:
                parents.append(-1)
                positions.append(-1 if c == 0 else 0)
                rs.append(torch.randint(0, vocab, (length,), generator=gen).tolist())
                continue
            parent = int(torch.randint(0, c, (1,), generator=gen))
            k = int(torch.randint(0, len(rs[parent]) + 1, (1,), generator=gen))
            parents.append(parent)
            positions.append(k)
            rs.append(rs[parent][:k] + torch.randint(0, vocab, (length,), generator=gen).tolist())
        responses.append(rs)
        trees.append(ChainTree(tuple(parents), tuple(positions), tuple(len(r) for r in rs)))
    prompts.append([1, 2])  # a one-token chain and a chain branching at token 0
    responses.append([[3], [3, 4, 5]])
    trees.append(ChainTree((-1, 0), (-1, 0), (1, 3)))
    prompts.append([6, 7, 8])  # a group of one chain
    responses.append([[9, 10, 11, 12]])
    trees.append(ChainTree((-1,), (-1,), (4,)))
    return prompts, responses, trees


def check_tree_attention(model: torch.nn.Module, device: torch.device) -> dict[str, Any]:
    prompts, groups, trees = _random_trees(0, model.config.vocab_size, groups=6, chains=8, max_len=48)
    packed = pack_trees(prompts, groups, trees, pad_token_id=0)
    padded = make_sequence_batch(
        [p for p, g in zip(prompts, groups, strict=True) for _ in g],
        [r for g in groups for r in g],
        pad_token_id=0,
    )
    advantages = torch.randn(packed.response_mask.shape, generator=torch.Generator().manual_seed(1)).to(
        device
    )

    def run(fn: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        model.zero_grad()
        logp, entropy = fn(model, batch, temperature=0.7)
        mask = batch.response_mask.to(device)
        loss = -(logp * advantages[:, : logp.shape[1]] * mask).sum() / mask.sum()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        return logp.detach() * mask, entropy * mask, grads

    t0 = time.perf_counter()
    lp_tree, h_tree, g_tree = run(packed_response_logprobs, packed)
    t_tree = time.perf_counter() - t0
    t0 = time.perf_counter()
    lp_dense, h_dense, g_dense = run(response_logprobs, padded)
    t_dense = time.perf_counter() - t0
    r = lp_dense.shape[1]
    logp_diff = (lp_tree[:, :r] - lp_dense).abs().max().item()
    entropy_diff = (h_tree[:, :r] - h_dense).abs().max().item()
    grad_rel = ((g_tree - g_dense).norm() / g_dense.norm()).item()
    return {
        "kernel": "flex_attention (compiled)" if device.type == "cuda" else "blockwise (CPU path)",
        "chains": int(padded.input_ids.shape[0]),
        "packed_tokens": int(packed.packed_tokens),
        "padded_tokens": int(padded.attention_mask.sum()),
        "max_abs_logprob_diff": logp_diff,
        "max_abs_entropy_diff": entropy_diff,
        "grad_relative_diff": grad_rel,
        "tree_s_first_call": t_tree,
        "dense_s": t_dense,
        "passed": logp_diff < 1e-3 and entropy_diff < 1e-3 and grad_rel < 1e-3,
    }


def check_bf16_master_step(model: torch.nn.Module, device: torch.device) -> dict[str, Any]:
    prompts, groups, _ = _random_trees(2, model.config.vocab_size, groups=4, chains=4, max_len=32)
    batch = make_sequence_batch(
        [p for p, g in zip(prompts, groups, strict=True) for _ in g],
        [r for g in groups for r in g],
        pad_token_id=0,
    )
    mask = batch.response_mask.to(device)
    with torch.no_grad():
        fp32_logp, _ = response_logprobs(model, batch, temperature=1.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model.zero_grad()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logp, _ = response_logprobs(model, batch, temperature=1.0)
    loss = -(logp * mask).sum() / mask.sum()
    loss.backward()
    grads_finite = all(torch.isfinite(p.grad).all().item() for p in model.parameters() if p.grad is not None)
    optimizer.step()
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters())
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    with torch.no_grad():  # undo the step: later checks start from the same weights
        for n, p in model.named_parameters():
            p.copy_(before[n])
    bf16_gap = ((logp.detach() - fp32_logp) * mask).abs().max().item()
    return {
        "loss": loss.item(),
        "grads_finite": grads_finite,
        "master_dtypes": dtypes,
        "max_weight_change": moved,
        "max_abs_logprob_gap_bf16_vs_fp32": bf16_gap,
        "passed": bool(torch.isfinite(loss).item())
        and grads_finite
        and dtypes == ["torch.float32"]
        and moved > 0
        and bf16_gap < 0.5,
    }


def _peak(device: torch.device, fn: Any) -> tuple[Any, float]:
    if device.type != "cuda":
        return fn(), float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return out, (torch.cuda.max_memory_allocated() - base) / 2**20


def check_chunked_head(device: torch.device, vocab: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(3)
    rows, width = 4096, 576
    hidden = (torch.randn(rows, width, generator=gen) * 0.5).to(device).requires_grad_(True)
    weight = (torch.randn(vocab, width, generator=gen) * 0.05).to(device).requires_grad_(True)
    targets = torch.randint(0, vocab, (rows,), generator=gen).to(device)
    upstream = torch.randn(rows, generator=gen).to(device)
    out: dict[str, Any] = {"rows": rows, "vocab": vocab}
    passed = True
    for name, dtype in (("fp32", None), ("bf16_autocast", torch.bfloat16)):

        def full(dtype: torch.dtype | None = dtype) -> tuple[torch.Tensor, ...]:
            hidden.grad = weight.grad = None
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                logits = hidden @ weight.T
            logp = torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None])[:, 0]
            (logp * upstream).sum().backward()
            return logp.detach(), hidden.grad.clone(), weight.grad.clone()

        def chunked(dtype: torch.dtype | None = dtype) -> tuple[torch.Tensor, ...]:
            hidden.grad = weight.grad = None
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                logp, _ = chunked_logprobs(hidden, weight, targets, with_entropy=False)
            (logp * upstream).sum().backward()
            return logp.detach(), hidden.grad.clone(), weight.grad.clone()

        (lp_f, gh_f, gw_f), mib_full = _peak(device, full)
        (lp_c, gh_c, gw_c), mib_chunked = _peak(device, chunked)
        tol = 1e-4 if dtype is None else 5e-2
        diffs = {
            "max_abs_logprob_diff": (lp_c - lp_f).abs().max().item(),
            "grad_hidden_relative_diff": ((gh_c - gh_f).norm() / gh_f.norm()).item(),
            "grad_weight_relative_diff": ((gw_c - gw_f).norm() / gw_f.norm()).item(),
        }
        ok = diffs["max_abs_logprob_diff"] < tol and max(
            diffs["grad_hidden_relative_diff"], diffs["grad_weight_relative_diff"]
        ) < (1e-4 if dtype is None else 2e-2)
        out[name] = {
            **diffs,
            "peak_MiB_full": mib_full,
            "peak_MiB_chunked": mib_chunked,
            "chunked_vs_full_memory": mib_chunked / mib_full if mib_full == mib_full else None,
            "passed": ok,
        }
        passed &= ok
    out["passed"] = passed
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    device = torch.device(args.device)
    info = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    print(json.dumps(info), flush=True)
    model = _model(args.model, device)
    results: dict[str, Any] = {"info": info}
    for name, check in (
        ("tree_attention", lambda: check_tree_attention(model, device)),
        ("bf16_master_step", lambda: check_bf16_master_step(model, device)),
        ("chunked_head", lambda: check_chunked_head(device, model.config.vocab_size)),
    ):
        t0 = time.perf_counter()
        try:
            results[name] = check()
        except Exception as err:  # noqa: BLE001 - a check that crashes is a failed check, named
            results[name] = {"passed": False, "error": f"{type(err).__name__}: {err}"}
        results[name]["seconds"] = time.perf_counter() - t0
        print(
            f"{'PASS' if results[name]['passed'] else 'FAIL'} {name}: {json.dumps(results[name])}", flush=True
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r.get("passed", True) for k, r in results.items() if k != "info") else 1


if __name__ == "__main__":
    sys.exit(main())
