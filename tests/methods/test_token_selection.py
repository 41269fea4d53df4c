"""Entropy-control losses on hand-computed tensors (no model)."""

import math

import pytest
import torch

from semrl.methods.token_losses import (
    clip_cov_loss,
    high_entropy_mask,
    kl_cov_loss,
    low_entropy_mask,
    sent_coefficients,
    sent_loss,
    token_covariance,
    top_k_mask,
)

# 2 sequences x 4 positions, the last position of row 1 is padding
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
ENTROPY = torch.tensor([[0.1, 2.0, 0.3, 0.05], [1.5, 0.2, 0.4, 0.0]])
LOGP = torch.tensor([[-0.1, -2.0, -0.5, -0.01], [-1.0, -0.2, -0.3, 0.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, 0.0]])


def test_token_covariance_by_hand():
    cov = token_covariance(LOGP, ADV, MASK)
    valid = MASK.bool()
    mean_a = ADV[valid].mean()  # (4 - 3) / 7
    mean_l = LOGP[valid].mean()
    expected = (ADV - mean_a) * (LOGP - mean_l) * MASK
    assert torch.allclose(cov, expected)
    assert cov[1, 3] == 0  # padding


def test_top_k_and_entropy_masks():
    # valid entropies sorted: 0.05 (0,3), 0.1 (0,0), 0.2 (1,1), 0.3 (0,2), 0.4 (1,2), 1.5 (1,0), 2.0 (0,1)
    low = low_entropy_mask(ENTROPY, MASK, 0.5)  # floor(0.5 * 7) = 3 lowest
    assert low.nonzero().tolist() == [[0, 0], [0, 3], [1, 1]]
    high = high_entropy_mask(ENTROPY, MASK, 0.2)  # max(1, floor(1.4)) = 1 highest
    assert high.nonzero().tolist() == [[0, 1]]
    assert not low[1, 3] and not high[1, 3]  # padding (entropy 0) is never selected
    assert top_k_mask(ENTROPY, MASK, 0).sum() == 0


def test_kl_cov_penalises_only_the_top_covariance_token():
    old = LOGP.detach() - 0.5  # |logp - old| = 0.5 everywhere
    logp = LOGP.clone().requires_grad_(True)
    loss, metrics = kl_cov_loss(logp, old, ADV, MASK, kl_cov_ratio=0.2, ppo_kl_coef=2.0)  # k = 1
    cov = token_covariance(LOGP, ADV, MASK)
    top = divmod(int(torch.argmax(cov.masked_fill(~MASK.bool(), -1e9))), 4)
    ratio = math.exp(0.5)
    expected = -ADV * ratio
    expected[top] += 2.0 * 0.5
    assert torch.allclose(loss, expected, atol=1e-6)
    assert metrics["kl_cov_frac"] == pytest.approx(1 / 7)
    # gradient: -A * ratio everywhere, plus coef * sign(logp - old) = +2 at the chosen token
    (loss * MASK).sum().backward()
    grad = -ADV * ratio * MASK
    grad[top] += 2.0
    assert torch.allclose(logp.grad, grad, atol=1e-5)


def test_clip_cov_zeroes_a_random_candidate_and_keeps_the_rest():
    # covariances 13.78 at position 0 and 1.25 * 1.225 elsewhere: one candidate in (2, 20)
    logp = torch.tensor([[-5.0, -0.1, -0.1, -0.1]])
    adv = torch.tensor([[-4.0, 1.0, 1.0, 1.0]])
    mask = torch.ones(1, 4)
    cov = token_covariance(logp, adv, mask)  # position 0: (-4 - -0.25)(-5 - -1.325) = 13.78
    assert cov[0, 0] > 5 and torch.allclose(cov[0, 1:], torch.tensor(1.25 * 1.225))
    loss, metrics = clip_cov_loss(
        logp, logp.clone(), adv, mask, 0.2, 0.2, clip_cov_ratio=0.5, cov_lb=2.0, cov_ub=20.0
    )
    assert loss[0, 0] == 0 and torch.allclose(loss[0, 1:], -adv[0, 1:])  # ratio 1
    assert metrics["clip_cov_frac"] == pytest.approx(0.25)
    # with ub below the only candidate's covariance nothing is dropped
    loss, metrics = clip_cov_loss(logp, logp.clone(), adv, mask, 0.2, 0.2, 0.5, 2.0, 5.0)
    assert torch.allclose(loss, -adv) and metrics["clip_cov_frac"] == 0


def test_sent_coefficients_paper_and_code_scopes():
    # 7 valid tokens, q = 0.8 -> 5 lowest-entropy tokens: (0,3) (0,0) (1,1) (0,2) (1,2)
    low = low_entropy_mask(ENTROPY, MASK, 0.8)
    assert low.sum() == 5
    cov = token_covariance(LOGP, ADV, low)
    order = sorted(((cov[i, j].item(), (i, j)) for i, j in low.nonzero().tolist()), reverse=True)
    top, bottom = order[0][1], order[-1][1]
    beta = sent_coefficients(ENTROPY, LOGP, ADV, MASK, 0.8, cov_top_ratio=0.2, beta_high=0.2, beta_low=0.05)
    # paper: beta_high on the single top-Cov token (m = max(1, floor(0.2 * 5)) = 1), beta_low on the other 4
    assert beta[top] == pytest.approx(0.2)
    assert (beta[low] > 0).all() and (beta[~low] == 0).all()
    assert torch.isclose(beta[low], torch.tensor(0.05)).sum() == 4
    code = sent_coefficients(ENTROPY, LOGP, ADV, MASK, 0.8, 0.2, 0.2, 0.05, beta_low_scope="bottom_cov_ratio")
    # code: beta_low only on the bottom-Cov token
    assert code[top] == pytest.approx(0.2) and code[bottom] == pytest.approx(0.05)
    assert (code > 0).sum() == 2


def test_sent_loss_terms_and_gradient():
    old = LOGP - 0.1
    beta = torch.tensor([[0.0, 0.2, 0.05, 0.0], [0.0, 0.0, 0.0, 0.0]])
    logp = LOGP.clone().requires_grad_(True)
    loss, metrics = sent_loss(logp, old, ADV, MASK, beta, "old_abs")
    ratio = math.exp(0.1)
    assert torch.allclose(loss, -ADV * ratio + beta * 0.1, atol=1e-6)
    (loss * MASK).sum().backward()
    assert torch.allclose(logp.grad, (-ADV * ratio + beta) * MASK, atol=1e-5)
    assert metrics["sent_regularised_frac"] == pytest.approx(2 / 7)
    assert metrics["sent_high_frac"] == pytest.approx(1 / 7)
    # a micro-batch without a high-covariance token has no high tokens (the beta_low ones are not)
    _, low_only = sent_loss(logp.detach(), old, ADV, MASK, torch.where(beta > 0, 0.05, 0.0), "old_abs")
    assert low_only["sent_high_frac"] == 0 and low_only["sent_regularised_frac"] == pytest.approx(2 / 7)
    # on-policy (old == current): the |.| term is 0 with zero gradient, as docs/algorithms.md "KL-Cov and Clip-Cov" notes
    logp2 = LOGP.clone().requires_grad_(True)
    loss2, _ = sent_loss(logp2, LOGP.clone(), ADV, MASK, beta, "old_abs")
    (loss2 * MASK).sum().backward()
    assert torch.allclose(logp2.grad, -ADV * MASK)
    # reference k3 target, and the optional PPO clip
    ref = LOGP - 1.0
    loss3, _ = sent_loss(LOGP, LOGP, ADV, MASK, beta, "ref_k3", ref_logp=ref, clip=(0.2, 0.2))
    k3 = math.exp(-1.0) + 1.0 - 1.0  # exp(ref - logp) - (ref - logp) - 1
    assert torch.allclose(loss3, -ADV + beta * k3, atol=1e-6)
    with pytest.raises(ValueError, match="reference"):
        sent_loss(LOGP, LOGP, ADV, MASK, beta, "ref_k3")
