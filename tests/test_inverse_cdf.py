"""The hf engine's draw for rows with their own seed (``rollout.seed_per_sequence`` and tree nodes):
inverting each row's CDF at one uniform, checked against the exact distribution."""

from __future__ import annotations

import pytest
import torch

from semrl.rollout.engines.hf import sample_inverse_cdf


@pytest.mark.parametrize("seed", range(5))
def test_inverse_cdf_draws_follow_each_rows_distribution(seed):
    """Random distributions with zeroed (filtered) tokens: empirical frequencies over 40,000 draws per
    row within 5 standard errors of the probabilities, and no zero-probability token ever drawn."""
    gen = torch.Generator().manual_seed(seed)
    rows, vocab, draws = 3, 12, 40_000
    probs = torch.rand(rows, vocab, generator=gen) ** 3
    probs[torch.rand(rows, vocab, generator=gen) < 0.3] = 0.0
    probs[:, 0] += 1e-3  # every row keeps a token
    probs = probs / probs.sum(-1, keepdim=True)
    counts = torch.zeros(rows, vocab)
    for _ in range(draws // 1000):
        uniforms = torch.rand(1000, rows, generator=gen)
        tokens = torch.stack([sample_inverse_cdf(probs, u) for u in uniforms])  # (1000, rows)
        counts += torch.nn.functional.one_hot(tokens, vocab).sum(0).float()
    freq = counts / draws
    se = (probs * (1 - probs) / draws).sqrt()
    assert bool(((freq - probs).abs() <= 5 * se + 1e-9).all()), (freq - probs).abs().max()
    assert bool((counts[probs == 0] == 0).all())


def test_inverse_cdf_edges():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5], [1.0, 0.0, 0.0, 0.0]])
    assert sample_inverse_cdf(probs, torch.tensor([0.0, 0.0])).tolist() == [1, 0]  # not the zero token
    assert sample_inverse_cdf(probs, torch.tensor([0.4999, 0.9999])).tolist() == [1, 0]
    assert sample_inverse_cdf(probs, torch.tensor([0.5, 0.5])).tolist() == [3, 0]
    assert sample_inverse_cdf(probs, torch.tensor([1.0 - 1e-12, 0.3])).tolist() == [3, 0]
