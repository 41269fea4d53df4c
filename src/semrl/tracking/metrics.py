"""A step's metrics, as pure functions of its rollout batches (no model needed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
import torch

from semrl.methods.token_losses import token_covariance
from semrl.reward import Scores
from semrl.rollout.batch import RolloutBatch
from semrl.rollout.engines import EngineCost
from semrl.tracking import metric_names as names

# what a step's rollout cost (docs/engines.md, "What a rollout costs"); the rates are timings
COST_METRICS = names.COST


def cost_metrics(
    cost: EngineCost, trajectories: int, seconds: float, total: Callable[[float], float] = float
) -> dict[str, float]:
    """A step's rollout cost from the engine's counters over it (``EngineCost.since``).

    ``rollout/sampled_tokens`` is the compute axis of ``semrl compare``: every token sampled in the
    step, dropped groups and tree branches included, shared prefixes once (docs/results.md). Token and
    trajectory counts are summed over processes by ``total``; engine steps and the running batch are
    this process's (the trainer averages them). The rates are TreePO's TokenPS and TrajPS: tokens
    sampled and responses finished per second of rollout.
    """
    sampled, trajectories_all = total(cost.sampled_tokens), total(trajectories)
    metrics = {
        names.SAMPLED_TOKENS: sampled,
        names.PREFILL_TOKENS: total(cost.prefill_tokens),
        names.ENGINE_STEPS: float(cost.engine_steps),
        names.RUNNING_BATCH: cost.mean_running_batch,
        names.TOKENS_PER_S: sampled / seconds if seconds > 0 else 0.0,
        names.TRAJECTORIES_PER_S: trajectories_all / seconds if seconds > 0 else 0.0,
        # the rollout's time: the engine's sampling, and the method's own work around it
        names.SAMPLING_S: cost.sampling_s,
        names.AROUND_SAMPLING_S: max(0.0, seconds - cost.sampling_s),
    }
    # vllm's fork (docs/engines.md, "Forks on vllm"), logged where some process had one; every process
    # sums (a collective under several processes)
    forked, fallbacks, refused = (
        total(cost.forked_requests),
        total(cost.fork_fallbacks),
        total(cost.holds_refused),
    )
    if forked or fallbacks or refused:
        metrics[names.FORKED_REQUESTS], metrics[names.FORK_FALLBACKS] = forked, fallbacks
        metrics[names.HOLDS_REFUSED] = refused
    return metrics


def reward_metrics(rounds: list[tuple[RolloutBatch, Scores]]) -> dict[str, float]:
    """Over every sequence sampled in the step: each round's batch and its scores (dynamic sampling
    has several rounds)."""
    rewards = torch.cat([s.rewards for _, s in rounds])
    results = [r for _, s in rounds for r in s.results]
    all_equal = ~torch.cat([s.informative_groups(b.group_size) for b, s in rounds])
    g = rounds[0][0].group_size
    # distinct extracted answers per group (None = no answer found counts as one more)
    distinct = [len({r.answer for r in results[i : i + g]}) for i in range(0, len(results), g)]
    return {
        names.REWARD: rewards.mean().item(),
        names.ACCURACY: float(np.mean([r.correct for r in results])),
        names.ALL_EQUAL: all_equal.float().mean().item(),
        names.DISTINCT_ANSWERS: float(np.mean(distinct)),
        "reward/verify_timeouts": float(sum(s.verify_timeouts for _, s in rounds)),
        **function_metrics([s for _, s in rounds]),
    }


def function_metrics(scores: list[Scores]) -> dict[str, float]:
    """Each reward function's mean score, errors and time-outs over the step's sequences."""
    n = max(1, sum(len(s.results) for s in scores))
    out: dict[str, float] = {}
    for s in scores:
        for key, value in s.function_sums.items():
            if key.endswith("/sum"):  # rewards/<function>/sum -> rewards/<function>/mean
                key, value = key.removesuffix("/sum") + "/mean", value / n
            out[key] = out.get(key, 0.0) + value
    return out


def rollout_metrics(
    batch: RolloutBatch, scores: Scores, measured_entropy: torch.Tensor | None = None
) -> dict[str, float]:
    """Sampling-time entropy and response lengths of the trained batch. ``measured_entropy``: (N, T)
    the sampling entropies the update measured, where the engine gave none (vllm)."""
    lengths = np.array([len(g.token_ids) for g in batch.generations], dtype=float)
    if measured_entropy is None:
        entropies = cast(list[torch.Tensor], [g.entropy for g in batch.generations])  # the engine's
    else:
        entropies = [measured_entropy[i, : len(g.token_ids)] for i, g in enumerate(batch.generations)]
    entropy = torch.cat(entropies)
    correct = np.array([r.correct for r in scores.results])
    return {
        names.ENTROPY: entropy.mean().item() if entropy.numel() else 0.0,
        names.RESPONSE_LENGTH: float(lengths.mean()),
        names.CORRECT_LENGTH: float(lengths[correct].mean()) if correct.any() else 0.0,
        names.TRUNCATED_FRAC: float(np.mean([g.truncated for g in batch.generations])),
    }


def entropy_metrics(
    batch: RolloutBatch,
    advantages: torch.Tensor,
    low_entropy_threshold: float,
    measured_entropy: torch.Tensor | None = None,
) -> dict[str, float]:
    """Entropy dynamics over the step's response tokens (rollout-time entropy and log-probs):
    the share of tokens below ``low_entropy_threshold`` nats and the mean Cov(logp, A).

    advantages: (N, T); ``measured_entropy``: (N, T) as in ``rollout_metrics``.
    """
    mask = batch.sequences.response_mask.bool()
    entropy = batch.sampling_entropy if measured_entropy is None else measured_entropy
    low = (entropy < low_entropy_threshold) & mask
    cov = token_covariance(batch.rollout_logprobs, advantages, mask)
    n = max(1, int(mask.sum()))
    return {"entropy/low_frac": low.sum().item() / n, "entropy/cov_logp_adv": cov.sum().item() / n}
