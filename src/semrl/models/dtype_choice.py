"""``model.dtype: auto``: the compute dtype chosen by measuring this machine (docs/training.md,
"Precision").

Whether bfloat16 pays on a CPU depends on the CPU: where it has AMX or AVX512-BF16, a bf16 matrix
product ran 5-7x faster than fp32, and a vllm step at bf16 took 0.59-0.75x its fp32 one; where it has
neither, bf16 ran about 5x slower than fp32. CPU flags do not say how fast a kernel runs (a
hypervisor may hide them, a library may not use them), so the choice is a measurement:
``probe_matmuls`` times the model's own matrix shapes (every linear layer of one decoder layer, and
the LM head) in both dtypes for well under a second, and the result is cached per machine and model
shape in ``$SEMRL_CACHE/dtype_probe.json``.

What each place does with it:
- a GPU: bfloat16 where it computes bf16, float32 otherwise (no probe);
- the vllm engine on a CPU: bfloat16 when the probe's bf16 is at least ``BF16_MIN_SPEEDUP`` times
  faster, then both the engine and the trainer's autocast compute in it;
- the hf engine on a CPU: float32. Its sampling and its update run under autocast over the float32
  master weights, which casts every weight at every forward; on the AMX machine the hf step at bf16
  took 0.94-1.02x the fp32 one (no gain end to end) while its matrix products ran 5-7x faster.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from semrl.core.atomic import write_text_atomic

logger = logging.getLogger(__name__)

BF16_MIN_SPEEDUP = 1.5  # bf16 must beat fp32 by this on the model's shapes before vllm takes it
PROBE_TOKENS = 128  # rows of each probed product: between vllm's decode batch (64) and an update's
PROBE_FILE = "dtype_probe.json"
PROBE_VERSION = 1  # part of the cache key: a changed probe measures again


@dataclass(frozen=True)
class ProbeResult:
    """Seconds of one pass over the probed shapes in each dtype (the fastest of its repeats)."""

    float32_s: float
    bfloat16_s: float

    @property
    def bf16_speedup(self) -> float:
        return self.float32_s / self.bfloat16_s if self.bfloat16_s > 0 else 0.0


@dataclass(frozen=True)
class DtypeChoice:
    """What ``auto`` resolved to, and why (logged in the run's first lines)."""

    dtype: str
    reason: str
    probe: ProbeResult | None = None


def linear_shapes(config: Any) -> list[tuple[int, int]]:
    """(in, out) of every linear layer of one decoder layer and of the LM head, from a transformers
    config: q, k, v, o, the MLP's gate, up and down, and the vocabulary projection."""
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads) * head_dim
    inter = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    return [
        (hidden, heads * head_dim),
        (hidden, kv),
        (hidden, kv),
        (heads * head_dim, hidden),
        (hidden, inter),
        (hidden, inter),
        (inter, hidden),
        (hidden, int(config.vocab_size)),
    ]


def probe_matmuls(shapes: list[tuple[int, int]], tokens: int = PROBE_TOKENS, repeats: int = 2) -> ProbeResult:
    """Time ``tokens`` x in @ in x out for every shape, weights and inputs in the dtype (as vllm holds
    bf16 weights), in float32 and in bfloat16: one warm-up pass, then the fastest of ``repeats``."""
    import torch

    def best(dtype: torch.dtype) -> float:
        pairs = [
            (
                torch.empty(tokens, n_in).uniform_(-1, 1).to(dtype),
                torch.empty(n_in, n_out).uniform_(-0.05, 0.05).to(dtype),
            )
            for n_in, n_out in shapes
        ]
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            for x, w in pairs:
                torch.mm(x, w)
            times.append(time.perf_counter() - start)
        return min(times[1:])

    return ProbeResult(best(torch.float32), best(torch.bfloat16))


def machine_key(shapes: list[tuple[int, int]], threads: int) -> str:
    """The cache key: the CPU (its model name and flags), torch's version, the threads and the shapes."""
    import torch

    cpu = platform.processor()
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((line for line in info if line.startswith("model name")), cpu)
        cpu += next((line for line in info if line.startswith("flags")), "")
    except OSError:
        pass
    text = json.dumps([PROBE_VERSION, cpu, torch.__version__, threads, shapes])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_probe(
    shapes: list[tuple[int, int]],
    cache_dir: Path,
    probe: Callable[[list[tuple[int, int]]], ProbeResult] = probe_matmuls,
) -> tuple[ProbeResult, bool]:
    """The probe's result for ``shapes`` on this machine, from the cache when it holds one (True), else
    measured now and cached (False). A damaged cache file is measured over, not trusted."""
    import torch

    path = cache_dir / PROBE_FILE
    key = machine_key(shapes, torch.get_num_threads())
    entries: dict[str, Any] = {}
    if path.is_file():
        try:
            entries = json.loads(path.read_text())
            return ProbeResult(**entries[key]), True
        except (KeyError, TypeError, ValueError):
            entries = entries if isinstance(entries, dict) else {}
    result = probe(shapes)
    entries[key] = asdict(result)
    try:
        write_text_atomic(path, json.dumps(entries, indent=1, sort_keys=True))
    except OSError as err:  # a read-only cache: measure again next time
        logger.warning("model.dtype=auto: could not cache the probe in %s (%s)", path, err)
    return result, False


def choose_dtype(
    engine: str,
    device_type: str,
    model_config: Any,
    cache_dir: Path,
    probe: Callable[[list[tuple[int, int]]], ProbeResult] = probe_matmuls,
) -> DtypeChoice:
    """What ``model.dtype: auto`` means for a run on ``engine`` and ``device_type`` with a model of
    ``model_config``'s shapes (the module's docstring says why)."""
    import torch

    if device_type == "cuda":
        if torch.cuda.is_bf16_supported():
            return DtypeChoice("bfloat16", "a GPU that computes bf16")
        return DtypeChoice("float32", "a GPU without bf16")
    if engine != "vllm":
        return DtypeChoice(
            "float32",
            "the hf engine on a CPU: its bf16 autocast casts every weight at every forward, and gained "
            "nothing end to end where bf16 matrix products ran 5-7x faster (docs/training.md)",
        )
    start = time.perf_counter()
    result, cached = cached_probe(linear_shapes(model_config), cache_dir, probe)
    source = "cached" if cached else f"measured in {time.perf_counter() - start:.2f} s"
    speedup = result.bf16_speedup
    dtype = "bfloat16" if speedup >= BF16_MIN_SPEEDUP else "float32"
    return DtypeChoice(
        dtype,
        f"this CPU computes the model's matrix shapes {speedup:.2f}x as fast in bf16 as in fp32 "
        f"({source}; bf16 from {BF16_MIN_SPEEDUP}x)",
        result,
    )
