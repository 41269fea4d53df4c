"""Hand-computed checks of group-relative advantages and the method registry."""

import pytest
import torch

from semrl.config.load import load_config
from semrl.methods.advantages import broadcast_to_tokens, group_centered_rewards
from semrl.methods.catalog import METHODS, get_method
from semrl.methods.interface import AdvantageInputs
from semrl.methods.registry import load, method_config


def test_dr_grpo_centres_per_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = group_centered_rewards(rewards, groups, normalize_std=False)
    expected = torch.tensor([2 / 3, -1 / 3, -1 / 3, -2 / 3, 1 / 3, 1 / 3])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_grpo_divides_by_unbiased_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv = group_centered_rewards(rewards, torch.zeros(4, dtype=torch.long), normalize_std=True, eps=0.0)
    std = torch.tensor([1.0, 0.0, 0.0, 0.0]).std()  # unbiased: sqrt(0.75 / 3) = 0.5
    assert std.item() == pytest.approx(0.5)
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]) / 0.5, atol=1e-6)


def test_all_equal_group_gives_zero_not_nan():
    adv = group_centered_rewards(torch.ones(4), torch.zeros(4, dtype=torch.long), normalize_std=True)
    assert torch.equal(adv, torch.zeros(4))


def test_groups_need_not_be_contiguous():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([7, 3, 7, 3])
    adv = group_centered_rewards(rewards, groups, normalize_std=False)
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_broadcast_to_tokens_zero_on_padding():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert torch.equal(out, torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))


def test_registry_methods_and_defaults():
    assert {"grpo", "dr_grpo"} <= set(METHODS)
    cfg = load_config(None, ["algorithm.method=dr_grpo"])  # the method's defaults fill the null keys
    assert cfg.algorithm.norm_adv_by_std is False and cfg.algorithm.loss_agg_mode == "seq-mean-token-sum-norm"
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 3))
    adv, metrics = load(get_method("dr_grpo").advantage_fn)(inputs, method_config(cfg, None))
    assert adv.shape == (2, 3) and metrics == {}
    assert torch.allclose(adv[:, 0], torch.tensor([0.5, -0.5]))
    grpo_cfg = load_config(None, ["algorithm.method=grpo", "algorithm.loss_agg_mode=token-mean"])
    assert grpo_cfg.algorithm.norm_adv_by_std is True and grpo_cfg.algorithm.loss_agg_mode == "token-mean"
    with pytest.raises(KeyError, match="Available"):
        get_method("nope")
