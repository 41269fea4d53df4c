"""Hand-computed checks of the loss functions."""

import math

import pytest
import torch

from semrl.methods.losses import aggregate_loss, kl_penalty, masked_mean, ppo_clip_loss


def test_ppo_clip_unclipped_region_is_minus_a_ratio():
    logp = torch.tensor([[math.log(1.1)]])
    old = torch.zeros(1, 1)
    adv = torch.tensor([[2.0]])
    loss, m = ppo_clip_loss(logp, old, adv, torch.ones(1, 1), 0.2, 0.2, None)
    assert loss.item() == pytest.approx(-2.2, rel=1e-6)
    assert m["clip_frac"].item() == 0.0


def test_ppo_clip_high_and_low_bounds():
    # ratio 1.5 > 1 + 0.28 with A > 0: clipped at 1.28 (clip-higher); ratio 0.5 < 0.8 with A < 0:
    # clipped at 0.8.
    logp = torch.log(torch.tensor([[1.5, 0.5]]))
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    loss, m = ppo_clip_loss(logp, old, adv, torch.ones(1, 2), 0.2, 0.28, None)
    assert loss[0, 0].item() == pytest.approx(-1.28, rel=1e-6)
    assert loss[0, 1].item() == pytest.approx(0.8, rel=1e-6)
    assert m["clip_frac"].item() == 1.0


def test_ppo_clipped_token_has_no_gradient():
    logp = torch.log(torch.tensor([[1.5]])).requires_grad_()
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([[1.0]]), torch.ones(1, 1), 0.2, 0.2, None)
    loss.sum().backward()
    assert logp.grad.item() == 0.0


def test_dual_clip_caps_negative_advantage_loss():
    # A = -1, ratio = 5: plain PPO loss = max(5, 1.2) = 5; dual clip caps at -A * 3 = 3.
    logp = torch.log(torch.tensor([[5.0]]))
    loss, m = ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), 0.2, 0.2, 3.0)
    assert loss.item() == pytest.approx(3.0)
    assert m["dual_clip_frac"].item() == 1.0
    # positive advantages are unaffected by the dual clip
    loss2, _ = ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([[1.0]]), torch.ones(1, 1), 0.2, 0.2, 3.0)
    assert loss2.item() == pytest.approx(-1.2)


def test_kl_estimators_by_hand():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    d = math.log(0.5) - math.log(0.25)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * d * d)
    # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 + ln 2 - 1
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl_penalty(logp, logp, "k3").item() == 0.0
    with pytest.raises(ValueError, match="k1, k2 or k3"):
        kl_penalty(logp, ref, "k4")  # type: ignore[arg-type]


def test_k3_is_clamped():
    big = kl_penalty(torch.tensor([0.0]), torch.tensor([100.0]), "k3")
    assert big.item() == 10.0


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_token_mean():
    assert aggregate_loss(LOSS, MASK, "token-mean").item() == pytest.approx(10 / 4)


def test_seq_mean_token_mean():
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx((2.0 + 4.0) / 2)


def test_seq_mean_token_sum_norm_is_drgrpo():
    # (6 / 8 + 4 / 8) / 2 sequences
    out = aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", max_response_length=8)
    assert out.item() == pytest.approx((6 / 8 + 4 / 8) / 2)
    with pytest.raises(ValueError, match="max_response_length"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_with_mini_batch_denominators_add_up(mode):
    """Splitting a mini-batch into micro-batches and summing gives the whole-batch loss."""
    torch.manual_seed(0)
    loss = torch.rand(6, 5)
    mask = (torch.rand(6, 5) > 0.3).float()
    mask[:, 0] = 1
    whole = aggregate_loss(loss, mask, mode, max_response_length=5)
    parts = sum(
        aggregate_loss(
            loss[i : i + 2],
            mask[i : i + 2],
            mode,
            num_sequences=6,
            num_tokens=int(mask.sum()),
            max_response_length=5,
        )
        for i in range(0, 6, 2)
    )
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_masked_mean_ignores_padding_and_empty_mask():
    assert masked_mean(LOSS, MASK).item() == pytest.approx(2.5)
    assert masked_mean(LOSS, torch.zeros_like(MASK)).item() == 0.0
