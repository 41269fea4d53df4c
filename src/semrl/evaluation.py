"""Evaluation: unbiased pass@k (Chen et al. 2021), mean@k and sampled/greedy accuracy."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from semrl.data import Problem, build_prompt_ids
from semrl.reward import VerifierPool, score_responses
from semrl.rollout import GenerationRequest, RolloutEngine, SamplingParams


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from c correct out of n:
    ``1 - C(n-c, k) / C(n, k)``, computed as a stable product; 1 when ``n - c < k``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def summarize_correctness(correct: list[list[bool]]) -> dict[str, float]:
    """mean@n and pass@k for k = 1, 2, 4, ... n from per-problem lists of n booleans."""
    n = len(correct[0])
    if any(len(c) != n for c in correct):
        raise ValueError("every problem needs the same number of samples")
    counts = [sum(c) for c in correct]
    out = {f"mean@{n}": float(np.mean([c / n for c in counts]))}
    ks = sorted({2**i for i in range(int(math.log2(n)) + 1)} | {n})
    for k in ks:
        out[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in counts]))
    return out


def evaluate_problems(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    pool: VerifierPool,
    problems: list[Problem],
    params: SamplingParams,
    num_samples: int,
    system_prompt: str | None,
    final_number_fallback: bool,
    generator: torch.Generator | None = None,
    progress: Callable[[int], Any] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Sample ``num_samples`` answers per problem and score them.

    Returns (metrics, records): metrics has mean@n, pass@k, mean response length, truncation
    rate and verification time-outs; records hold one entry per sample.
    """
    prompt_ids = [build_prompt_ids(tokenizer, p.problem, system_prompt) for p in problems]
    requests = [GenerationRequest(ids) for ids in prompt_ids for _ in range(num_samples)]
    gens = []
    step = engine.batch_size
    for start in range(0, len(requests), step):
        gens.extend(engine.generate(requests[start : start + step], params, generator))
        if progress is not None:
            progress(min(step, len(requests) - start))
    texts = [tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in gens]
    golds = [p.answer for p in problems for _ in range(num_samples)]
    timeouts_before = pool.num_timeouts
    rewards = score_responses(pool, texts, golds, final_number_fallback=final_number_fallback)
    correct = [
        [rewards[i * num_samples + j].correct for j in range(num_samples)] for i in range(len(problems))
    ]
    metrics = summarize_correctness(correct)
    metrics["response_length"] = float(np.mean([len(g.token_ids) for g in gens]))
    metrics["truncated_frac"] = float(np.mean([g.truncated for g in gens]))
    metrics["verify_timeouts"] = float(pool.num_timeouts - timeouts_before)
    records = [
        {
            "id": problems[i // num_samples].id,
            "gold": golds[i],
            "answer": rewards[i].answer,
            "correct": rewards[i].correct,
            "response": texts[i],
        }
        for i in range(len(gens))
    ]
    return metrics, records
