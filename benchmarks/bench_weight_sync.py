"""Peak extra memory of pushing FSDP-sharded weights to an engine, 2 processes on the CPU (gloo):
the whole model gathered at once on every process (torch's ``get_model_state_dict`` with
``full_state_dict=True``, the push as it was before) vs one parameter at a time
(``semrl.core.distributed.iter_full_parameters``, what ``sync_weights`` now receives), in one run.

    python benchmarks/bench_weight_sync.py [--model smollm2-135m]

Each variant runs in a fresh pair of processes, so that each one's peak resident memory (VmHWM) is
its own; "extra" is the peak during the push minus the resident memory just before it. The consumer
holds each tensor until the next one arrives, as vLLM's ``reload_weights`` does with a stream.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MIB = 2**20


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:  # resets VmHWM to the current resident size
        fh.write("5")


def _worker(rank: int, variant: str, model_path: str, init: str, out: str) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from semrl.core.distributed import iter_full_parameters
    from semrl.models.loading import load_model

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    model = load_model(model_path)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    params = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() for p in model.parameters())
    dist.barrier()
    _reset_peak()
    before = _status("VmRSS")
    received = 0
    if variant == "whole model":
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        received = sum(t.numel() for t in state.values())
        del state
    else:
        for _, tensor in iter_full_parameters(model):
            received += tensor.numel()
    extra = _status("VmHWM") - before
    dist.barrier()
    if rank == 0:
        with open(out, "w") as fh:
            fh.write(f"{extra} {params} {largest} {received}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    from semrl.models.loading import resolve_model_path

    path = resolve_model_path(args.model)
    rows = {}
    for variant in ("whole model", "one parameter at a time"):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "result")
            mp.spawn(_worker, args=(variant, path, f"file://{tmp}/rendezvous", out), nprocs=2)
            extra, params, largest, received = (int(v) for v in open(out).read().split())
        rows[variant] = extra
    print(
        f"model {args.model}: {params / 1e6:.1f} M parameters ({params * 4 / MIB:.0f} MiB fp32), largest "
        f"parameter {largest / 1e6:.1f} M ({largest * 4 / MIB:.0f} MiB); {received / 1e6:.1f} M values pushed"
    )
    print("| weight push under FSDP, 2 processes | peak extra memory per process | vs whole model |")
    print("|---|---|---|")
    for variant, extra in rows.items():
        print(f"| {variant} | {extra / MIB:.0f} MiB | {extra / rows['whole model']:.2f}x |")


if __name__ == "__main__":
    main()
