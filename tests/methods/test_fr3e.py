"""FR3E anchors, state budgets and advantage modulation on hand-computed inputs."""

import math

import pytest
import torch

from semrl.config.load import load_config
from semrl.config.sections import ConfigError
from semrl.methods.fr3e.method import fr3e_modulation, select_anchors, state_sizes


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
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.5, -0.5]) / torch.tensor(
        [math.exp(0.75)] * 4 + [math.exp(0.25)] * 2
    )
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


def _fr3e_code_reference(rewards: list[float], states: list[int], sharpen: bool) -> list[float]:
    """FR3E's code, restated: drop state groups whose rewards are all equal (its dynamic sampling),
    centre each kept group by its mean, v_j = share of positive centred scores, delta_0 = 1 - v_0,
    delta_j = v_j - v_(j-1) over the kept groups in order, optional sharpening, divide by exp(delta)."""
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(states):
        groups.setdefault(s, []).append(i)
    out = [0.0] * len(rewards)
    kept = [s for s in sorted(groups) if len(groups[s]) > 1 and len({rewards[i] for i in groups[s]}) > 1]
    centred, values = {}, []
    for s in kept:
        mean = sum(rewards[i] for i in groups[s]) / len(groups[s])
        centred[s] = {i: rewards[i] - mean for i in groups[s]}
        values.append(sum(c > 0 for c in centred[s].values()) / len(groups[s]))
    deltas = [1 - values[0] if k == 0 else values[k] - values[k - 1] for k in range(len(values))]
    if sharpen and deltas:
        powered = [abs(d) ** 1.5 for d in deltas]
        total = sum(powered)
        deltas = [
            math.copysign(p / total, d) if d != 0 else 0.0 for p, d in zip(powered, deltas, strict=True)
        ]
    for s, d in zip(kept, deltas, strict=True):
        for i, c in centred[s].items():
            out[i] = c / math.exp(d)
    return out


def test_states_whose_continuations_all_agree_are_left_out_of_the_values():
    # the example: states [1,0], [1,1], [1,0], [0,0]; FR3E's code gives the third state +-0.5
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    states = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    adv = fr3e_modulation(rewards, states, sharpen=True)
    assert adv[4:6].tolist() == pytest.approx([0.5, -0.5])
    assert adv[2:4].tolist() == [0.0, 0.0] and adv[6:].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("sharpen", [True, False])
def test_modulation_equals_fr3e_code_on_random_groups(sharpen):
    gen = torch.Generator().manual_seed(0)
    for case in range(2000):
        g = int(torch.randint(2, 13, (1,), generator=gen))
        num_states = int(torch.randint(1, min(g, 5) + 1, (1,), generator=gen))
        states = [j for j, n in enumerate(state_sizes(g, num_states)) for _ in range(n)]
        p = float(torch.rand(1, generator=gen))
        if case % 3 == 0:  # shaped rewards: 1/0 minus an overlong penalty
            rewards = (
                (torch.rand(g, generator=gen) < p).float() - 0.25 * torch.randint(0, 3, (g,), generator=gen)
            ).tolist()
        else:
            rewards = (torch.rand(g, generator=gen) < p).float().tolist()
        got = fr3e_modulation(torch.tensor(rewards), torch.tensor(states), sharpen=sharpen)
        want = _fr3e_code_reference(rewards, states, sharpen)
        assert got.tolist() == pytest.approx(want, abs=1e-5), (rewards, states)
