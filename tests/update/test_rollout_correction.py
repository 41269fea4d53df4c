"""Rollout correction (``algorithm.rollout_is``): the importance weights against a plain-Python
reference on random padded batches, and their use in every method's loss."""

from __future__ import annotations

import math
import random

import pytest
import torch

from semrl.methods.losses import rollout_correction


def _reference(old, rollout, lengths, level, cap, mode):
    """Per sequence, per token, in Python floats."""
    weights, ratios, capped, kls = [], [], [], []
    for row, n in enumerate(lengths):
        w_row = [0.0] * len(old[row])
        seq = sum(old[row][t] - rollout[row][t] for t in range(n))
        for t in range(n):
            lr = (old[row][t] - rollout[row][t]) if level != "sequence" else seq
            r = math.exp(max(-20.0, min(20.0, lr)))
            ratios.append(r)
            capped.append(r > cap)
            d = max(-20.0, min(20.0, old[row][t] - rollout[row][t]))
            kls.append(math.exp(d) - d - 1.0)
            if level == "none":
                w_row[t] = 1.0
            elif mode == "truncate":
                w_row[t] = min(r, cap)
            else:
                w_row[t] = 0.0 if r > cap else r
        weights.append(w_row)
    mean = (lambda xs: sum(xs) / len(xs)) if ratios else (lambda xs: 0.0)
    return weights, {
        "mismatch_kl": mean(kls),
        "ratio_mean": mean(ratios),
        "ratio_max": max(ratios, default=1.0),
        "capped_frac": mean([float(c) for c in capped]),
    }


@pytest.mark.parametrize("level", ["none", "token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_weights_match_the_reference_on_random_padded_batches(level, mode):
    rng = random.Random(f"{level}-{mode}")
    for case in range(40):
        n, width = rng.randint(1, 6), rng.randint(1, 9)
        lengths = [rng.randint(0 if case % 5 == 0 else 1, width) for _ in range(n)]  # some empty rows
        scale = rng.choice([1e-3, 0.05, 0.5, 3.0])  # from a tiny mismatch to ratios far above the cap
        old = [[-rng.random() * 4 for _ in range(width)] for _ in range(n)]
        rollout = [[o + rng.gauss(0, scale) for o in row] for row in old]
        cap = rng.choice([1.0, 1.5, 2.0, 10.0])
        mask = torch.tensor([[1.0 if t < length else 0.0 for t in range(width)] for length in lengths])
        # padding holds garbage: it must not leak into weights or metrics
        old_t = torch.tensor(old) * mask + (1 - mask) * 7.0
        rollout_t = torch.tensor(rollout) * mask - (1 - mask) * 5.0
        weights, metrics = rollout_correction(old_t, rollout_t, mask, level, cap, mode)
        expected, expected_metrics = _reference(old, rollout, lengths, level, cap, mode)
        assert torch.allclose(weights, torch.tensor(expected), rtol=1e-5, atol=1e-6), (case, lengths)
        assert not weights.requires_grad
        for key, value in expected_metrics.items():
            assert metrics[key].item() == pytest.approx(value, rel=1e-4, abs=1e-6), (case, key)


def test_weights_carry_no_gradient_and_equal_one_without_mismatch():
    logp = torch.randn(3, 4, requires_grad=True)
    mask = torch.ones(3, 4)
    weights, metrics = rollout_correction(logp, logp.detach().clone(), mask, "token", 2.0)
    assert torch.equal(weights, mask) and not weights.requires_grad
    assert metrics["mismatch_kl"].item() == 0.0 and metrics["capped_frac"].item() == 0.0


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_every_method_loss_is_weighted_by_the_correction(level):
    """micro_batch_loss with the correction equals the loss aggregated over weighted tokens, for
    every registered policy loss; with rollout_is=none it is the plain loss, metrics included."""
    from semrl.config.load import load_config
    from semrl.methods.catalog import POLICY_LOSSES
    from semrl.methods.losses import aggregate_loss
    from semrl.methods.policy_loss import PolicyLossInputs, micro_batch_loss
    from semrl.methods.registry import load, method_config

    gen = torch.Generator().manual_seed(0)
    n, width = 6, 5
    mask = (torch.arange(width)[None] < torch.tensor([5, 3, 1, 4, 5, 2])[:, None]).float()
    logp = (-torch.rand(n, width, generator=gen) * 3).requires_grad_()
    old = logp.detach() + 0.05 * torch.randn(n, width, generator=gen)
    rollout = old + 0.3 * torch.randn(n, width, generator=gen)
    for name, loss in POLICY_LOSSES.items():
        totals = {}
        for setting in ("none", level):
            cfg = load_config(
                None,
                [
                    f"algorithm.rollout_is={setting}",
                    "algorithm.rollout_is_cap=1.5",
                    "algorithm.loss_agg_mode=token-mean",
                    "sent.selection_scope=micro",
                    "entropy_8020.code_compat=true",
                ],
            )
            config = method_config(cfg, loss.section)
            x = PolicyLossInputs(
                logp=logp,
                old_logp=old,
                advantages=torch.randn(n, width, generator=torch.Generator().manual_seed(1)),
                mask=mask,
                entropy=torch.rand(n, width, generator=torch.Generator().manual_seed(2)),
                ref_logp=old,
                generator=torch.Generator().manual_seed(3),
                num_tokens=int(mask.sum()),
                rollout_logp=rollout,
            )
            total, metrics, _ = micro_batch_loss(load(loss.loss_fn), x, config, n)
            x.generator = torch.Generator().manual_seed(3)  # Clip-Cov draws from it: the same draws again
            token_loss, _ = load(loss.loss_fn)(x, config)
            weights, _ = rollout_correction(old, rollout, mask, setting, 1.5)
            expected = aggregate_loss(
                token_loss * weights,
                mask,
                "token-mean",
                num_sequences=n,
                num_tokens=int(mask.sum()),
                max_response_length=width,
            )
            assert torch.allclose(total, expected, atol=1e-6), (name, setting)
            assert metrics["rollout_is/mismatch_kl"] > 0
            totals[setting] = total.item()
        assert totals["none"] != totals[level], name  # the weights changed the loss
