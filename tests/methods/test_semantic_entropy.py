"""Semantic entropy, SEED-GRPO scaling and DAPO overlong shaping on hand-computed inputs."""

import math

import pytest
import torch

from semrl.config.load import load_config
from semrl.methods.catalog import get_method
from semrl.methods.interface import AdvantageInputs
from semrl.methods.registry import load, method_config
from semrl.methods.seed_grpo.advantages import uncertainty_scale
from semrl.methods.semantic_entropy import cluster_answers, cluster_entropy
from semrl.reward.shaping import overlong_penalty


def test_clusters_by_normalised_string_and_none_is_a_singleton():
    ids = cluster_answers(["12", " 12 ", "\\dfrac{1}{2}", "\\frac{1}{2}", None, None, "7"])
    assert ids == [0, 0, 1, 1, 2, 3, 4]
    # a custom equivalence (here numeric) merges what strings do not
    ids = cluster_answers(["0.5", "1/2", "2"], equivalent=lambda a, b: eval(a) == eval(b))  # noqa: S307
    assert ids == [0, 0, 1]


def test_cluster_entropy_extremes_and_a_worked_case():
    assert cluster_entropy([0] * 8, torch.zeros(8)) == 0.0
    assert cluster_entropy(list(range(8)), torch.full((8,), -1.3)) == pytest.approx(math.log(8))
    assert cluster_entropy(list(range(8)), estimator="frequency") == pytest.approx(math.log(8))
    # masses: cluster 0 = e^0 + e^0 = 2, cluster 1 = e^{log 2} = 2 -> p = (1/2, 1/2)
    assert cluster_entropy([0, 0, 1], torch.tensor([0.0, 0.0, math.log(2)])) == pytest.approx(math.log(2))
    # frequency: counts (2, 1) -> p = (2/3, 1/3)
    h = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    assert cluster_entropy([0, 0, 1], estimator="frequency") == pytest.approx(h)
    with pytest.raises(ValueError, match="mean log-prob"):
        cluster_entropy([0, 1])


def test_uncertainty_scale_functions():
    x = torch.tensor([0.0, 0.5, 2.0])
    assert torch.allclose(uncertainty_scale(x, "linear"), torch.tensor([1.0, 0.5, 0.0]))
    assert torch.allclose(uncertainty_scale(x, "inverse"), torch.tensor([1.0, 2 / 3, 1 / 3]))
    assert torch.allclose(uncertainty_scale(x, "exp"), torch.exp(-x))


def test_seed_grpo_scales_advantages_by_group_semantic_entropy():
    cfg = load_config(
        None, ["algorithm.method=seed_grpo", "seed_grpo.alpha=1.0", "seed_grpo.likelihood=frequency"]
    )
    spec = get_method("seed_grpo")
    assert cfg.algorithm.norm_adv_by_std is False
    # group 0: answers all equal (SE = 0, scale 1); group 1: 4 distinct answers (SE = log 4 = max, scale 0)
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    inputs = AdvantageInputs(
        rewards,
        torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
        torch.ones(8, 2),
        answers=["3", "3", "3", "3", "1", "2", "4", None],
    )
    adv, metrics = load(spec.advantage_fn)(inputs, method_config(cfg, "seed_grpo"))
    assert torch.allclose(adv[:4, 0], torch.tensor([0.5, 0.5, -0.5, -0.5]))
    assert torch.allclose(adv[4:], torch.zeros(4, 2))
    assert metrics["seed/semantic_entropy"] == pytest.approx(math.log(4) / 2)
    # half the answers shared: SE = log 2 (frequency), x = log 2 / log 4 = 0.5 -> scale 0.5
    inputs.answers = ["3", "3", "3", "3", "1", "1", "2", "2"]
    adv, _ = load(spec.advantage_fn)(inputs, method_config(cfg, "seed_grpo"))
    assert torch.allclose(adv[4:, 0], 0.5 * torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_overlong_penalty_matches_dapo():
    lengths = torch.tensor([10, 48, 56, 64])
    pen = overlong_penalty(lengths, max_length=64, buffer_length=16, penalty_factor=1.0)
    assert torch.allclose(pen, torch.tensor([0.0, 0.0, -0.5, -1.0]))
    assert torch.equal(overlong_penalty(lengths, 64, 0, 1.0), torch.zeros(4))
