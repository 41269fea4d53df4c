"""FR3E anchors, state budgets and advantage modulation on hand-computed inputs."""

import math

import pytest
import torch

from semrl.algos.fr3e import fr3e_modulation, select_anchors, state_sizes
from semrl.config import ConfigError, load_config


def test_anchors_are_the_top_scores_after_position_zero_sorted():
    scores = torch.tensor([9.0, 0.1, 3.0, 0.2, 5.0, 4.0])
    assert select_anchors(scores, 3) == [2, 4, 5]  # position 0 (the prompt state) excluded
    assert select_anchors(scores[:2], 3) == [1]
    assert select_anchors(scores[:1], 3) == []


def test_state_sizes_spread_the_group():
    assert state_sizes(8, 4) == [2, 2, 2, 2]
    assert state_sizes(8, 5) == [2, 2, 2, 1, 1]
    assert sum(state_sizes(7, 3)) == 7


def test_modulation_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    states = torch.tensor([0, 0, 0, 0, 1, 1])
    # state 0: mean 0.25, centred (.75, -.25, -.25, -.25), v0 = 1/4; state 1: (.5, -.5), v1 = 1/2
    # delta = (1 - v0, v1 - v0) = (.75, .25)
    plain = fr3e_modulation(rewards, states, sharpen=False)
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.5, -0.5]) / torch.tensor([math.exp(0.75)] * 4 + [math.exp(0.25)] * 2)
    assert torch.allclose(plain, expected, atol=1e-6)
    # sharpened: |d|^1.5 = (.6495, .125), normalised (.8386, .1614)
    d0 = 0.75**1.5 / (0.75**1.5 + 0.25**1.5)
    sharp = fr3e_modulation(rewards, states, sharpen=True)
    assert sharp[0].item() == pytest.approx(0.75 / math.exp(d0), abs=1e-6)
    assert sharp[4].item() == pytest.approx(0.5 / math.exp(1 - d0), abs=1e-6)
    # all-equal rewards: zero advantages everywhere
    assert torch.equal(fr3e_modulation(torch.ones(4), torch.tensor([0, 0, 1, 1])), torch.zeros(4))


def test_too_many_anchors_for_the_group_is_a_config_error():
    with pytest.raises(ConfigError, match="fr3e.num_anchors"):
        load_config(None, ["algorithm.method=fr3e", "fr3e.num_anchors=8", "rollout.group_size=8"])
