"""The full-vocabulary entropy of a request's tokens, from vLLM's own sampler (docs/engines.md,
"Entropy on vllm").

FR3E's anchors and ROSE's ``entropy_mode=full_vocab`` read the entropy of each sampled position's
tempered next-token distribution during the rollout. vLLM returns log-probs only, so without this
the trainer runs a forward of the trained model over each chain once it is back (FR3E: 7.6-9.2 s of
a 38 s rollout at 32 prompts on this CPU, docs/benchmarks.md). ``SamplingEntropy`` is a vLLM logits
processor (vLLM's public interface, ``vllm.v1.sample.logits_processor``): vLLM applies it to the
logits of every step that samples at random, after temperature and before top-k/top-p, which is the
trainer's definition (tempered, unfiltered). For the rows whose request asked
(``SamplingParams.extra_args[ENTROPY_KEY]``, a request id), it records -sum p log p in the trainer's
formula at the request's output position, and returns the logits unchanged, so no token changes.
This module imports no vLLM (the engine reads its records); ``processor_class`` makes the processor.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the records are read
here (``take``). A position is keyed by the request's output length when its logits are sampled: a
sample vLLM drops (a chunked prefill's) or recomputes (after a preemption) is overwritten by the one
that counts. A request whose record is incomplete gets None, and the trainer's forward instead.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from semrl.core.entropy import entropy_from_logprobs
from semrl.rollout.engines.vllm import state

ENTROPY_KEY = "semrl_entropy"


def take(request_id: str, length: int) -> torch.Tensor | None:
    """(length,) the recorded entropies of a finished request's tokens, forgotten here; None when a
    position was not recorded."""
    record = state.ENTROPY_RECORDS.pop(request_id, [])
    if len(record) < length or any(value != value for value in record[:length]):
        return None
    return torch.tensor(record[:length], dtype=torch.float32)


def forget(request_ids: list[str]) -> None:
    """Drop the records of requests that will not finish (aborted, or their call raised)."""
    for request_id in request_ids:
        state.ENTROPY_RECORDS.pop(request_id, None)


def recording() -> int:
    """Requests with a record (0 after every engine call)."""
    return len(state.ENTROPY_RECORDS)


def record(rows: dict[int, tuple[str, list[int]]], logits: torch.Tensor) -> None:
    """Record, for each asking row (row -> (request id, its live output tokens)), the entropy of its
    logits at the request's output position. logits: (rows, V) the step's tempered logits."""
    order = sorted(rows)
    picked = logits[torch.tensor(order, device=logits.device)].float()
    # the trainer's formula (semrl.core.entropy) over log p = z - logsumexp(z)
    values = entropy_from_logprobs(picked - torch.logsumexp(picked, dim=-1, keepdim=True)).tolist()
    for row, value in zip(order, values, strict=True):
        request_id, output_ids = rows[row]
        entries = state.ENTROPY_RECORDS.setdefault(request_id, [])
        position = len(output_ids)
        if position < len(entries):
            entries[position] = value
        else:  # a position never recorded (should not happen) reads as missing
            entries.extend([float("nan")] * (position - len(entries)))
            entries.append(value)


def follow(rows: dict[int, tuple[str, list[int]]], batch_update: Any) -> None:
    """Apply one of vLLM's ``BatchUpdate``s to ``rows``: removals, then additions (a request that asks
    names itself in ``SamplingParams.extra_args``), then one-way moves and swaps."""
    for row in batch_update.removed:
        rows.pop(row, None)
    for row, params, _, output_ids in batch_update.added:
        request_id = (params.extra_args or {}).get(ENTROPY_KEY) if params is not None else None
        if request_id is None:
            rows.pop(row, None)
        else:
            rows[row] = (str(request_id), output_ids)
    for a, b, direction in batch_update.moved:
        entry_a, entry_b = rows.pop(a, None), rows.pop(b, None)
        if entry_a is not None:
            rows[b] = entry_a
        if direction.name == "SWAP" and entry_b is not None:
            rows[a] = entry_b


@cache
def processor_class() -> type:
    """``SamplingEntropy``, vLLM's ``LogitsProcessor`` subclass that vLLM is started with. It imports
    vLLM, so it is made only once ``semrl.rollout.engines.vllm.start.import_vllm`` has set vLLM up."""
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class SamplingEntropy(LogitsProcessor):
        """Records the entropy of the rows whose request asks; changes no logit."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.rows: dict[int, tuple[str, list[int]]] = {}  # batch row -> (request id, output tokens)

        def is_argmax_invariant(self) -> bool:
            """Applied only to rows sampled at random, to the tempered logits (``Sampler.sample``)."""
            return True

        def update_state(self, batch_update: Any) -> None:
            if batch_update is not None:
                follow(self.rows, batch_update)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            """logits: (rows, V) the step's tempered logits; returned as they are."""
            if self.rows:
                record(self.rows, logits)
            return logits

    return SamplingEntropy
