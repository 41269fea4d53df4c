"""Every method's tensor functions against an independent reference written here from the paper's
or the official code's definition, on many random padded batches: junk in the padding, positive and
negative advantages, degenerate groups (all correct, all wrong, one chain, one valid token).
The references work on plain Python lists of the valid tokens, so a mask mistake shows."""

from __future__ import annotations

import math

import pytest
import torch

from semrl.config.load import load_config
from semrl.methods.advantages import broadcast_to_tokens, group_centered_rewards
from semrl.methods.interface import AdvantageInputs
from semrl.methods.losses import aggregate_loss, kl_penalty, ppo_clip_loss
from semrl.methods.registry import method_config
from semrl.methods.seed_grpo.advantages import seed_grpo_advantages
from semrl.methods.token_losses import (
    clip_cov_loss,
    high_entropy_mask,
    kl_cov_loss,
    sent_coefficients,
    sent_loss,
)
from semrl.reward.shaping import overlong_penalty

CASES = 300


def _batch(gen: torch.Generator, degenerate: bool = False):
    """(logp, old_logp, adv, mask, entropy) of shape (N, T) with junk on padding."""
    n = int(torch.randint(1, 6, (1,), generator=gen))
    t = int(torch.randint(1, 9, (1,), generator=gen))
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    logp = -torch.rand(n, t, generator=gen) * 4
    old = logp + 0.3 * torch.randn(n, t, generator=gen)  # never equal to logp: chosen tokens show
    adv = torch.randn(n, 1, generator=gen).expand(n, t).clone() + 0.5 * torch.randn(n, t, generator=gen)
    if degenerate:
        adv = torch.full((n, t), float(torch.randn(1, generator=gen)))
    entropy = torch.rand(n, t, generator=gen) * 3
    junk = 1 - mask
    # padding: huge entropies, log-probs and advantages that would be picked if the mask were ignored
    return logp + 50 * junk, old - 50 * junk, adv + 100 * junk, mask, entropy + 100 * junk


def _valid(x: torch.Tensor, mask: torch.Tensor) -> list[float]:
    return [float(v) for v, m in zip(x.flatten(), mask.flatten(), strict=True) if m > 0]


def _cov(logp: list[float], adv: list[float]) -> list[float]:
    ml, ma = sum(logp) / len(logp), sum(adv) / len(adv)
    return [(a - ma) * (lp - ml) for lp, a in zip(logp, adv, strict=True)]


def _is_top(chosen: list[bool], scores: list[float], k: int, largest: bool = True) -> bool:
    """``chosen`` is a valid top-k set of ``scores`` (any tie order)."""
    if sum(chosen) != k:
        return False
    inside = [s for s, c in zip(scores, chosen, strict=True) if c]
    outside = [s for s, c in zip(scores, chosen, strict=True) if not c]
    if not inside or not outside:
        return True
    return min(inside) >= max(outside) - 1e-7 if largest else max(inside) <= min(outside) + 1e-7


# ----------------------------------------------------------------------------------------------
# GRPO, Dr.GRPO: advantages and loss aggregation


@pytest.mark.parametrize("normalize", [True, False])
def test_group_advantages_equal_the_definition(normalize):
    gen = torch.Generator().manual_seed(1)
    for case in range(CASES):
        g = int(torch.randint(1, 6, (1,), generator=gen))
        groups = int(torch.randint(1, 4, (1,), generator=gen))
        rewards = (torch.rand(groups * g, generator=gen) < 0.5).float()
        if case % 4 == 0:
            rewards[:g] = 1.0  # an all-correct group
        if case % 4 == 1:
            rewards[:g] = 0.0  # an all-wrong group
        ids = torch.arange(groups).repeat_interleave(g)
        got = group_centered_rewards(rewards, ids, normalize_std=normalize)
        for k in range(groups):
            r = rewards[k * g : (k + 1) * g].tolist()
            mean = sum(r) / g
            std = math.sqrt(sum((x - mean) ** 2 for x in r) / (g - 1)) if g > 1 else 0.0
            want = [(x - mean) / (std + 1e-6) if normalize else x - mean for x in r]
            assert got[k * g : (k + 1) * g].tolist() == pytest.approx(want, abs=1e-5)
        mask = (torch.rand(groups * g, 5, generator=gen) < 0.7).float()
        tokens = broadcast_to_tokens(got, mask)
        assert torch.equal(tokens, got[:, None] * mask)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_equals_the_definition(mode):
    gen = torch.Generator().manual_seed(2)
    for _ in range(CASES):
        _, _, _, mask, _ = _batch(gen)
        loss = torch.randn(mask.shape, generator=gen) + 1000 * (1 - mask)  # junk on padding
        rows = [
            [float(v) for v, m in zip(lr, mr, strict=True) if m > 0]
            for lr, mr in zip(loss, mask, strict=True)
        ]
        budget = mask.shape[1] + 3
        got = aggregate_loss(loss, mask, mode, max_response_length=budget)
        if mode == "token-mean":
            want = sum(map(sum, rows)) / sum(map(len, rows))
        elif mode == "seq-mean-token-mean":
            want = sum(sum(r) / len(r) for r in rows) / len(rows)
        else:  # Dr.GRPO: per-sequence sum / the response budget, mean over sequences
            want = sum(sum(r) / budget for r in rows) / len(rows)
        assert got.item() == pytest.approx(want, abs=1e-4)


# ----------------------------------------------------------------------------------------------
# DAPO: clip-higher with dual clip, overlong shaping


def test_ppo_clip_equals_verls_formula():
    gen = torch.Generator().manual_seed(3)
    for _ in range(CASES):
        logp, old, adv, mask, _ = _batch(gen)
        low, high, c = 0.2, 0.28, 3.0
        got, _ = ppo_clip_loss(logp, old, adv, mask, low, high, c)
        for lp, o, a, m, value in zip(
            logp.flatten(), old.flatten(), adv.flatten(), mask.flatten(), got.flatten(), strict=True
        ):
            if not m:
                continue
            ratio = math.exp(max(-20.0, min(20.0, float(lp - o))))
            loss = max(-float(a) * ratio, -float(a) * min(max(ratio, 1 - low), 1 + high))
            if a < 0:
                loss = min(loss, -float(a) * c)
            assert float(value) == pytest.approx(loss, rel=1e-4, abs=1e-5)


def test_overlong_penalty_equals_dapo():
    for max_len, buffer, factor in [(64, 16, 1.0), (10, 3, 0.5), (8, 1, 2.0)]:
        lengths = torch.arange(0, max_len + 1)
        got = overlong_penalty(lengths, max_len, buffer, factor).tolist()
        want = [min(0.0, (max_len - buffer - n) / buffer * factor) for n in lengths.tolist()]
        assert got == pytest.approx(want)


# ----------------------------------------------------------------------------------------------
# KL-Cov, Clip-Cov, 80/20 (verl's and the papers' definitions; selection over valid tokens)


def test_kl_cov_equals_the_definition():
    gen = torch.Generator().manual_seed(4)
    for case in range(CASES):
        logp, old, adv, mask, _ = _batch(gen, degenerate=case % 5 == 0)
        ratio_k, coef = 0.3, 0.7
        got, _ = kl_cov_loss(logp, old, adv, mask, ratio_k, coef)
        lp, o, a, g = _valid(logp, mask), _valid(old, mask), _valid(adv, mask), _valid(got, mask)
        base = [-ai * math.exp(li - oi) for li, oi, ai in zip(lp, o, a, strict=True)]
        chosen = [abs(gi - bi) > 1e-6 for gi, bi in zip(g, base, strict=True)]
        k = max(1, int(ratio_k * len(lp)))
        assert _is_top(chosen, _cov(lp, a), k)
        for gi, bi, li, oi, c in zip(g, base, lp, o, chosen, strict=True):
            assert gi == pytest.approx(bi + (coef * abs(li - oi) if c else 0.0), rel=1e-4, abs=1e-5)


def test_clip_cov_drops_random_tokens_among_the_candidates():
    gen = torch.Generator().manual_seed(5)
    for _ in range(CASES):
        logp, old, adv, mask, _ = _batch(gen)
        low, high, ratio_c, lb, ub = 0.2, 0.2, 0.25, -0.5, 1.0
        got, _ = clip_cov_loss(
            logp, old, adv, mask, low, high, ratio_c, lb, ub, torch.Generator().manual_seed(0)
        )
        ppo, _ = ppo_clip_loss(logp, old, adv, mask, low, high, None)
        lp, o, a = _valid(logp, mask), _valid(old, mask), _valid(adv, mask)
        g, p = _valid(got, mask), _valid(ppo, mask)
        cov = _cov(lp, a)
        unclipped = [
            abs(pi - (-ai * math.exp(li - oi))) < 1e-6 for pi, ai, li, oi in zip(p, a, lp, o, strict=True)
        ]
        candidates = [u and lb < c < ub for u, c in zip(unclipped, cov, strict=True)]
        n_pick = min(max(1, int(ratio_c * len(lp))), sum(candidates))
        dropped = [gi == 0.0 and pi != 0.0 for gi, pi in zip(g, p, strict=True)]
        assert sum(dropped) == n_pick
        assert all(c for c, d in zip(candidates, dropped, strict=True) if d)
        assert all(gi == pytest.approx(pi) for gi, pi, d in zip(g, p, dropped, strict=True) if not d)
    # drawn at random: over many draws every candidate is dropped, not only the highest-Cov ones
    logp = torch.tensor([[-1.0, -2.0, -0.5, -1.5, -3.0, -0.2]])
    adv = torch.tensor([[1.0, -1.0, 2.0, 0.5, -2.0, 1.5]])
    mask = torch.ones(1, 6)
    hits = torch.zeros(6)
    for seed in range(300):
        loss, _ = clip_cov_loss(
            logp, logp.clone(), adv, mask, 0.2, 0.2, 0.2, -10.0, 10.0, torch.Generator().manual_seed(seed)
        )
        hits += (loss == 0).float().flatten()
    assert (hits > 20).all(), hits


def test_high_entropy_mask_keeps_the_top_quantile_of_valid_tokens():
    gen = torch.Generator().manual_seed(6)
    for _ in range(CASES):
        _, _, _, mask, entropy = _batch(gen)
        q = float(torch.rand(1, generator=gen)) * 0.9 + 0.05
        got = high_entropy_mask(entropy, mask, q)
        assert not (got & (mask == 0)).any()  # padding (entropy 100+) is never kept
        h = _valid(entropy, mask)
        chosen = [bool(x) for x in _valid(got.float(), mask)]
        assert _is_top(chosen, h, max(1, int(q * len(h))))


# ----------------------------------------------------------------------------------------------
# SENT (the paper's beta_con on low-entropy tokens, and the code's scope)


@pytest.mark.parametrize("scope", ["rest_of_low", "bottom_cov_ratio"])
def test_sent_coefficients_equal_the_definition(scope):
    gen = torch.Generator().manual_seed(7)
    for case in range(CASES):
        logp, _, adv, mask, entropy = _batch(gen, degenerate=case % 5 == 0)
        entropy = torch.where(mask > 0, entropy, -100.0)  # padding that would look lowest-entropy
        q, ratio, bh, bl = 0.8, 0.25, 0.2, 0.05
        beta = sent_coefficients(entropy, logp, adv, mask, q, ratio, bh, bl, scope)
        assert not ((beta != 0) & (mask == 0)).any()
        h, lp, a, b = _valid(entropy, mask), _valid(logp, mask), _valid(adv, mask), _valid(beta, mask)
        n_low = max(1, int(q * len(h)))
        low_idx = sorted(range(len(h)), key=lambda i: h[i])[:n_low]  # the n_low lowest entropies
        assert all(i in low_idx for i, bi in enumerate(b) if bi > 0)  # only low-entropy tokens get a beta
        cov = _cov([lp[i] for i in low_idx], [a[i] for i in low_idx])
        m = max(1, int(ratio * n_low))
        high = [abs(b[i] - bh) < 1e-6 for i in low_idx]
        assert _is_top(high, cov, m)
        rest = [i for i, hi in zip(low_idx, high, strict=True) if not hi]
        if scope == "rest_of_low":
            assert all(abs(b[i] - bl) < 1e-6 for i in rest)
        else:
            chosen = [abs(b[i] - bl) < 1e-6 for i in rest]
            rest_cov = [c for c, hi in zip(cov, high, strict=True) if not hi]
            assert _is_top(chosen, rest_cov, min(m, len(rest)), largest=False)


@pytest.mark.parametrize("kl_target", ["old_abs", "ref_k3"])
@pytest.mark.parametrize("clip", [None, (0.2, 0.28)])
def test_sent_loss_equals_the_definition(kl_target, clip):
    gen = torch.Generator().manual_seed(8)
    for _ in range(CASES // 3):
        logp, old, adv, mask, _ = _batch(gen)
        ref = logp - 0.2 * torch.randn(logp.shape, generator=gen)
        beta = torch.where(torch.rand(logp.shape, generator=gen) < 0.3, 0.2, 0.0) * mask
        got, _ = sent_loss(logp, old, adv, mask, beta, kl_target, ref, clip)
        for lp, o, a, r, b, m, value in zip(
            *(x.flatten() for x in (logp, old, adv, ref, beta, mask, got)), strict=True
        ):
            if not m:
                continue
            ratio = math.exp(float(lp - o))
            pg = (
                -float(a) * ratio
                if clip is None
                else max(-float(a) * ratio, -float(a) * min(max(ratio, 1 - clip[0]), 1 + clip[1]))
            )
            kl = abs(float(lp - o)) if kl_target == "old_abs" else math.exp(float(r - lp)) - float(r - lp) - 1
            assert float(value) == pytest.approx(pg + float(b) * kl, rel=1e-4, abs=1e-5)
    assert torch.allclose(kl_penalty(torch.zeros(1), torch.ones(1), "k3"), torch.tensor([math.e - 2]))


# ----------------------------------------------------------------------------------------------
# SEED-GRPO


@pytest.mark.parametrize("likelihood", ["length_normalized", "frequency"])
@pytest.mark.parametrize("scale_fn", ["linear", "inverse", "exp"])
def test_seed_grpo_equals_the_definition(likelihood, scale_fn):
    cfg = load_config(
        None,
        [
            "algorithm.method=seed_grpo",
            f"seed_grpo.likelihood={likelihood}",
            f"seed_grpo.scale_fn={scale_fn}",
            "seed_grpo.alpha=0.8",
        ],
    )
    gen = torch.Generator().manual_seed(9)
    for _ in range(CASES // 3):
        g, groups, t = (
            int(torch.randint(2, 7, (1,), generator=gen)),
            int(torch.randint(1, 4, (1,), generator=gen)),
            6,
        )
        n = g * groups
        rewards = (torch.rand(n, generator=gen) < 0.5).float()
        answers = [
            None if torch.rand(1, generator=gen) < 0.2 else str(int(torch.randint(0, 3, (1,), generator=gen)))
            for _ in range(n)
        ]
        lengths = torch.randint(1, t + 1, (n,), generator=gen)
        mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
        logprobs = -torch.rand(n, t, generator=gen) * 2 - 30 * (1 - mask)  # junk on padding
        ids = torch.arange(groups).repeat_interleave(g)
        inputs = AdvantageInputs(rewards, ids, mask, answers=answers, logprobs=logprobs)
        got, metrics = seed_grpo_advantages(inputs, method_config(cfg, "seed_grpo"))
        for k in range(groups):
            rows = range(k * g, (k + 1) * g)
            clusters: dict[str, list[int]] = {}
            for i in rows:
                clusters.setdefault(answers[i] if answers[i] is not None else f"none-{i}", []).append(i)
            if likelihood == "frequency":
                masses = [len(c) for c in clusters.values()]
            else:
                mean_logp = {
                    i: sum(_valid(logprobs[i : i + 1], mask[i : i + 1])) / int(lengths[i]) for i in rows
                }
                masses = [sum(math.exp(mean_logp[i]) for i in c) for c in clusters.values()]
            total = sum(masses)
            se = -sum(m / total * math.log(m / total) for m in masses)
            x = 0.8 * se / math.log(g)
            scale = {"linear": max(0.0, 1 - x), "inverse": 1 / (1 + x), "exp": math.exp(-x)}[scale_fn]
            mean = sum(float(rewards[i]) for i in rows) / g
            for i in rows:
                want = (float(rewards[i]) - mean) * scale
                assert got[i, : int(lengths[i])].tolist() == pytest.approx([want] * int(lengths[i]), abs=1e-5)
                assert got[i, int(lengths[i]) :].abs().sum() == 0
        assert set(metrics) == {"seed/semantic_entropy", "seed/scale"}


def test_8020_code_compat_averages_over_each_micro_batchs_selected_tokens():
    """The official 80/20 code: per micro-batch, the top-entropy tokens of the current entropies,
    the PPO loss averaged over them (token-mean), then averaged over the micro-batches."""
    from semrl.methods.entropy_8020.loss import high_entropy
    from semrl.methods.policy_loss import PolicyLossInputs

    cfg = load_config(None, ["algorithm.method=entropy_8020", "entropy_8020.code_compat=true"])
    gen = torch.Generator().manual_seed(10)
    for _ in range(CASES // 3):
        micro = [_batch(gen) for _ in range(int(torch.randint(1, 4, (1,), generator=gen)))]
        num_tokens = int(sum(m[3].sum() for m in micro))
        total, want = 0.0, 0.0
        for logp, old, adv, mask, entropy in micro:
            x = PolicyLossInputs(
                logp, old, adv, mask, entropy=entropy, num_tokens=num_tokens, num_micro_batches=len(micro)
            )
            loss, _ = high_entropy(x, method_config(cfg, "entropy_8020"))
            total += aggregate_loss(loss, mask, "token-mean", num_tokens=num_tokens).item()
            ppo, _ = ppo_clip_loss(logp, old, adv, mask, 0.2, 0.2, 3.0)
            h, p = _valid(entropy, mask), _valid(ppo, mask)
            top = sorted(range(len(h)), key=lambda i: -h[i])[: max(1, int(0.2 * len(h)))]
            want += sum(p[i] for i in top) / len(top) / len(micro)
        assert total == pytest.approx(want, rel=1e-4, abs=1e-5)
    with pytest.raises(Exception, match="token-mean"):
        load_config(
            None,
            [
                "algorithm.method=entropy_8020",
                "entropy_8020.code_compat=true",
                "algorithm.loss_agg_mode=seq-mean-token-mean",
            ],
        )
