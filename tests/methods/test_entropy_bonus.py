"""The entropy bonus (algorithm.entropy_coeff): the entropy it reads, its sign and aggregation in the
loss against an independent computation on random batches, the adaptive coefficient against TRL's
rule, and in training: it raises the entropy, and an adaptive run resumes exactly."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from semrl.config.sections import AlgorithmConfig, ConfigError, RolloutConfig
from semrl.methods.entropy_bonus import EntropyBonus
from semrl.methods.losses import aggregate_loss
from semrl.methods.policy_loss import PolicyLossInputs, micro_batch_loss
from semrl.methods.registry import MethodConfig, get_policy_loss, load
from semrl.update.lm_head import chunked_logprobs

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _entropy(logits: list[float], temperature: float = 1.0) -> float:
    hidden, weight = torch.ones(1, 1), torch.tensor(logits)[:, None]  # hidden @ weight.T = the logits
    _, h = chunked_logprobs(hidden, weight, torch.zeros(1, dtype=torch.long), temperature=temperature)
    return float(h[0])


def test_reference_entropies():
    """rivals.md 2.5: the full-vocabulary entropy of the temperature-scaled distribution."""
    assert _entropy([0.0, 0.0]) == pytest.approx(0.693147, abs=1e-6)
    assert _entropy([math.log(3), 0.0]) == pytest.approx(0.562335, abs=1e-6)
    assert _entropy([math.log(3), 0.0], temperature=2.0) == pytest.approx(0.656806, abs=1e-6)
    assert _entropy([0.0] * 4) == pytest.approx(1.386294, abs=1e-6)


def _config(mode: str, max_new_tokens: int = 3) -> MethodConfig:
    return MethodConfig(
        None,
        AlgorithmConfig(loss_agg_mode=mode, clip_ratio_low=0.2, clip_ratio_high=0.2),
        RolloutConfig(max_new_tokens=max_new_tokens),
    )


def test_reference_aggregation_and_loss():
    """Entropies [1.0] and [0.2, 0.2, 0.2], mask width 3: token-mean 0.4, seq-mean-token-mean 0.6;
    semrl's seq-mean-token-sum-norm is the mean over sequences of sum / 3 (verl's sums: 0.5333);
    pg 0.1 - 0.001 x 0.4 = 0.0996."""
    entropy = torch.tensor([[1.0, 0, 0], [0.2, 0.2, 0.2]])
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    want = {"token-mean": 0.4, "seq-mean-token-mean": 0.6, "seq-mean-token-sum-norm": 1.6 / 3 / 2}
    for mode, value in want.items():
        assert float(aggregate_loss(entropy, mask, mode, max_response_length=3)) == pytest.approx(
            value, abs=1e-6
        )
    # a per-token policy loss of 0.1 everywhere: ratio 1, advantage -0.1
    x = PolicyLossInputs(
        logp=torch.zeros(2, 3),
        old_logp=torch.zeros(2, 3),
        advantages=torch.full((2, 3), -0.1),
        mask=mask,
        num_tokens=4,
        entropy_coeff=0.001,
        bonus_entropy=entropy,
    )
    total, metrics, _ = micro_batch_loss(
        load(get_policy_loss("ppo").loss_fn), x, _config("token-mean"), num_sequences=2
    )
    assert float(total) == pytest.approx(0.0996, abs=1e-7)
    assert float(metrics["entropy_bonus"]) == pytest.approx(0.4, abs=1e-7)


def _reference_aggregate(values, mask, mode, n_seq, n_tok, budget):
    """Written out per sequence in float64, independently of semrl.methods.losses."""
    rows = []
    for v, m in zip(values.double().tolist(), mask.double().tolist(), strict=True):
        s = sum(a * b for a, b in zip(v, m, strict=True))
        rows.append((s, sum(m)))
    if mode == "token-mean":
        return sum(s for s, _ in rows) / n_tok
    if mode == "seq-mean-token-mean":
        return sum(s / max(n, 1) for s, n in rows) / n_seq
    return sum(s / budget for s, _ in rows) / n_seq


@pytest.mark.parametrize("mode", MODES)
def test_loss_is_policy_term_minus_coeff_times_aggregated_entropy(mode):
    """On 300 random micro-batches (padding, signs, all-masked rows): the total loss and its gradient
    through the entropy equal pg - coeff x agg(H) computed independently."""
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    for _ in range(300):
        n, t = rng.randint(1, 5), rng.randint(1, 7)
        mask = (torch.rand(n, t, generator=gen) < 0.7).float()
        logp = -torch.rand(n, t, generator=gen) * 2
        old = logp + torch.randn(n, t, generator=gen) * 0.1
        adv = torch.randn(n, t, generator=gen)
        entropy = (torch.rand(n, t, generator=gen) * 3).requires_grad_()
        coeff = rng.choice([0.0, 1e-3, 0.5, 2.0])
        n_tok, n_seq = int(mask.sum()) + rng.randint(0, 3), n + rng.randint(0, 2)
        x = PolicyLossInputs(
            logp, old, adv, mask, num_tokens=max(n_tok, 1), entropy_coeff=coeff, bonus_entropy=entropy
        )
        config = _config(mode, max_new_tokens=t)
        total, _, _ = micro_batch_loss(load(get_policy_loss("ppo").loss_fn), x, config, num_sequences=n_seq)
        pg, _, _ = micro_batch_loss(
            load(get_policy_loss("ppo").loss_fn),
            PolicyLossInputs(logp, old, adv, mask, num_tokens=max(n_tok, 1)),
            config,
            num_sequences=n_seq,
        )
        agg = _reference_aggregate(entropy.detach(), mask, mode, n_seq, max(n_tok, 1), t)
        assert float(total.detach()) == pytest.approx(float(pg) - coeff * agg, abs=1e-5)
        if coeff:
            (grad,) = torch.autograd.grad(total, entropy)
            if mode == "token-mean":
                want = -coeff * mask / max(n_tok, 1)
            elif mode == "seq-mean-token-mean":
                want = -coeff * mask / mask.sum(-1, keepdim=True).clamp(min=1) / n_seq
            else:
                want = -coeff * mask / t / n_seq
            torch.testing.assert_close(grad, want)  # the sign: a larger entropy lowers the loss


def test_adaptive_coefficient_follows_trls_rule():
    bonus = EntropyBonus(coeff=0.01, target=0.2, delta=0.005)
    assert bonus.current() == 0.01  # before any measurement the bonus applies
    bonus.observe(0.15)
    assert bonus.coeff == pytest.approx(0.015) and bonus.current() == pytest.approx(0.015)
    bonus = EntropyBonus(coeff=0.01, target=0.2, delta=0.005)
    bonus.observe(0.3)
    assert bonus.coeff == pytest.approx(0.005) and bonus.current() == 0.0  # switched off next step
    rng = random.Random(0)
    for _ in range(300):
        low, high = sorted(rng.uniform(0, 0.1) for _ in range(2))
        coeff, target, delta = rng.uniform(low, high), rng.uniform(0, 1), rng.uniform(0, 0.02)
        bonus, ref_coeff, ref_on = EntropyBonus(coeff, target, delta, low, high), coeff, True
        for _ in range(20):
            assert bonus.current() == pytest.approx(ref_coeff if ref_on else 0.0)
            e = rng.uniform(0, 1)
            ref_coeff = min(high, max(low, ref_coeff + delta if e <= target else ref_coeff - delta))
            ref_on = e <= target
            bonus.observe(e)
        state = bonus.state_dict()
        again = EntropyBonus(0.0, target, delta, low, high)
        again.load_state_dict(state)
        assert again.current() == bonus.current()
    fixed = EntropyBonus(coeff=0.3)
    fixed.observe(5.0)
    assert fixed.current() == 0.3 and fixed.enabled and not EntropyBonus().enabled


def test_config_errors_name_the_key():
    from semrl.config.load import load_config

    with pytest.raises(ConfigError, match=r"algorithm\.entropy_coeff"):
        load_config(None, ["algorithm.entropy_coeff=-0.1"])
    with pytest.raises(ConfigError, match=r"algorithm\.entropy_coeff"):
        load_config(None, ["algorithm.entropy_coeff=2", "algorithm.entropy_target=0.2"])
    cfg = load_config(None, ["algorithm.entropy_coeff=0.01", "algorithm.entropy_target=0.2"])
    assert EntropyBonus.from_config(cfg.algorithm) == EntropyBonus(0.01, 0.2, 0.005, 0.0, 1.0)
    assert (
        EntropyBonus.from_config(
            SimpleNamespace(
                entropy_coeff=0.0,
                entropy_target=None,
                entropy_coeff_delta=0.005,
                entropy_coeff_min=0.0,
                entropy_coeff_max=1.0,
            )
        ).enabled
        is False
    )


@pytest.mark.parametrize("packing", ["none", "tree"])
def test_the_bonus_raises_the_entropy_in_training(digit_model_dir, seven_task, tmp_path, packing):
    """One update with a bonus of 1 (the digit model's entropy is ~1.3 nats): the batch's entropy
    after it is well above that of the same update without a bonus (measured 3.2 vs 1.3 nats)."""
    from semrl.config.load import load_config
    from semrl.runtime.trainer import Trainer
    from semrl.update.row_logprobs import batch_logprobs
    from tests.helpers import DIGIT_SYSTEM_PROMPT

    after = {}
    for coeff in (0.0, 1.0):
        cfg = load_config(
            None,
            [
                f"model.name={digit_model_dir}",
                f"data.train={seven_task}",
                "data.eval=null",
                f"data.system_prompt={DIGIT_SYSTEM_PROMPT}",
                "rollout.group_size=4",
                "rollout.prompts_per_step=4",
                "rollout.max_new_tokens=4",
                "trainer.micro_batch_size=8",
                "trainer.lr=3e-3",
                "trainer.steps=1",
                "reward.num_workers=1",
                "logging.progress=false",
                "logging.report_to=[]",
                f"trainer.packing={packing}",
                f"logging.output_dir={tmp_path / str(coeff)}",
                f"algorithm.entropy_coeff={coeff}",
            ],
        )
        trainer = Trainer(cfg)
        batch = trainer.rollout()  # the same responses in both runs, measured after the update
        last = trainer.train()
        if coeff:
            assert last["actor/entropy_coeff"] == 1.0 and last["actor/entropy_bonus"] > 0
        rows = [torch.arange(len(batch.generations))]
        _, entropy = batch_logprobs(trainer.models.model, batch, 1.0, rows, packed=False, with_entropy=True)
        mask = batch.sequences.response_mask.float()
        after[coeff] = float((entropy * mask).sum() / mask.sum())
    assert after[1.0] > after[0.0] + 0.5, after
