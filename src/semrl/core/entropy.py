"""The full-vocabulary entropy of next-token distributions, the one formula that sampling (hf's
engine, vLLM's sampler) and the update's forward (``semrl.update.lm_head``) record, so that they
agree to the bit on the same log-probabilities (docs/engines.md, "Entropy on vllm")."""

from __future__ import annotations

import torch


def entropy_from_logprobs(logp: torch.Tensor) -> torch.Tensor:
    """(..., V) log-probabilities of full distributions -> (...) their entropy, -sum p log p.

    Computed from the log-probabilities, not as logsumexp - sum p z, which loses digits on peaked
    rows; ``logp`` is left as it is."""
    return -torch.exp(logp).mul_(logp).sum(-1)
