"""A step's metrics, the group filter and the curriculum schedule, on random batches without a model."""

from __future__ import annotations

import math

import pytest
import torch

from semrl.config.sections import AlgorithmConfig
from semrl.core.distributed import ProcessGroup
from semrl.data import Problem
from semrl.data.curriculum import StageSchedule
from semrl.reward import RewardResult, Scores
from semrl.rollout.batch import RolloutBatch
from semrl.rollout.engines import Generation
from semrl.rollout.group_filter import GroupFilter, choose_groups, split_groups
from semrl.tracking.metrics import entropy_metrics, reward_metrics, rollout_metrics


def _random_batch(gen: torch.Generator, groups: int, group_size: int) -> tuple[RolloutBatch, Scores]:
    n = groups * group_size
    lengths = torch.randint(1, 9, (n,), generator=gen).tolist()
    gens = [
        Generation(
            token_ids=torch.randint(5, 50, (length,), generator=gen),
            logprobs=-torch.rand(length, generator=gen) * 3,
            top_logprobs=torch.zeros(length, 2),
            top_ids=torch.zeros(length, 2, dtype=torch.long),
            entropy=torch.rand(length, generator=gen) * 2,
            finished=bool(torch.rand(1, generator=gen) < 0.7),
        )
        for length in lengths
    ]
    batch = RolloutBatch(
        problems=[Problem(f"p{i // group_size}", "q", "1") for i in range(n)],
        prompt_ids=[[1, 2, 3] for _ in range(n)],
        generations=gens,
        texts=["x"] * n,
        group_size=group_size,
        pad_token_id=0,
    )
    correct = (torch.rand(n, generator=gen) < 0.4).tolist()
    answers = [
        str(int(torch.randint(0, 3, (1,), generator=gen))) if torch.rand(1, generator=gen) < 0.8 else None
        for _ in range(n)
    ]
    results = tuple(RewardResult(float(c), a, bool(c), False) for c, a in zip(correct, answers, strict=True))
    rewards = torch.tensor([float(c) for c in correct]) - 0.1 * torch.rand(n, generator=gen).round()
    return batch, Scores(rewards, results, verify_timeouts=int(torch.randint(0, 3, (1,), generator=gen)))


@pytest.mark.parametrize("seed", range(20))
def test_metrics_equal_a_direct_computation(seed):
    gen = torch.Generator().manual_seed(seed)
    g = 4
    rounds = [_random_batch(gen, groups=3, group_size=g) for _ in range(2)]
    out = reward_metrics(rounds)
    rewards = [r for _, s in rounds for r in s.rewards.tolist()]
    results = [r for _, s in rounds for r in s.results]
    groups = [rewards[i : i + g] for i in range(0, len(rewards), g)]
    answers = [[r.answer for r in results[i : i + g]] for i in range(0, len(results), g)]
    assert out["reward"] == pytest.approx(sum(rewards) / len(rewards))
    assert out["accuracy"] == pytest.approx(sum(r.correct for r in results) / len(results))
    assert out["reward/frac_groups_all_equal"] == pytest.approx(
        sum(len(set(x)) == 1 for x in groups) / len(groups)
    )
    assert out["reward/distinct_answers_per_group"] == pytest.approx(
        sum(len(set(a)) for a in answers) / len(answers)
    )
    assert out["reward/verify_timeouts"] == sum(s.verify_timeouts for _, s in rounds)

    batch, scores = rounds[0]
    lengths = [len(x.token_ids) for x in batch.generations]
    correct = [r.correct for r in scores.results]
    out = rollout_metrics(batch, scores)
    tokens = [h for x in batch.generations for h in x.entropy.tolist()]
    assert out["entropy"] == pytest.approx(sum(tokens) / len(tokens))
    assert out["response_length"] == pytest.approx(sum(lengths) / len(lengths))
    good = [n for n, c in zip(lengths, correct, strict=True) if c]
    assert out["response_length/correct"] == pytest.approx(sum(good) / len(good) if good else 0.0)
    assert out["response_length/truncated_frac"] == pytest.approx(
        sum(not x.finished for x in batch.generations) / len(lengths)
    )

    # entropy dynamics: padding holds junk that must not count
    adv = torch.randn(batch.sequences.response_mask.shape, generator=gen)
    pad = 1 - batch.sequences.response_mask
    batch.sampling_entropy = batch.sampling_entropy - 3.0 * pad  # junk that would count as low entropy
    batch.rollout_logprobs = batch.rollout_logprobs + 7.0 * pad
    adv = adv + 11.0 * pad
    threshold = 0.7
    out = entropy_metrics(batch, adv, threshold)
    valid = [(i, t) for i, x in enumerate(batch.generations) for t in range(len(x.token_ids))]
    low = sum(batch.generations[i].entropy[t] < threshold for i, t in valid)
    assert out["entropy/low_frac"] == pytest.approx(float(low) / len(valid))
    logp = [batch.generations[i].logprobs[t].item() for i, t in valid]
    a = [adv[i, t].item() for i, t in valid]
    mean_l, mean_a = sum(logp) / len(logp), sum(a) / len(a)
    cov = sum((x - mean_l) * (y - mean_a) for x, y in zip(logp, a, strict=True)) / len(valid)
    assert out["entropy/cov_logp_adv"] == pytest.approx(cov, abs=1e-5)


@pytest.mark.parametrize("seed", range(10))
def test_group_filter_keeps_groups_whose_rewards_differ(seed):
    gen = torch.Generator().manual_seed(seed)
    batch, scores = _random_batch(gen, groups=5, group_size=3)
    scores.rewards[:3] = 1.0  # group 0: all equal
    keep = scores.informative_groups(3, "reward")
    for g in range(5):
        assert bool(keep[g]) == (len(set(scores.rewards[3 * g : 3 * g + 3].tolist())) > 1)
    by_accuracy = scores.informative_groups(3, "accuracy")
    for g in range(5):
        assert bool(by_accuracy[g]) == (len({r.correct for r in scores.results[3 * g : 3 * g + 3]}) > 1)
    kept, dropped = split_groups(batch, scores, "reward")
    assert [g for _, _, g in kept] == [g for g in range(5) if keep[g]] and len(kept) + len(dropped) == 5
    chosen = choose_groups(kept, dropped, 4)
    assert chosen == (kept + dropped)[:4]


@pytest.mark.parametrize("seed", range(12))
def test_group_filter_over_rounds_matches_a_direct_selection(seed):
    """The filter the trainer feeds round by round: it asks for rounds until enough groups differ or
    the round limit is reached, keeps informative groups first in sampling order, fills with the
    others, and counts what every round sampled."""
    gen = torch.Generator().manual_seed(seed)
    wanted, g, limit = 4, 3, int(torch.randint(1, 5, (1,), generator=gen))
    dynamic = seed % 4 != 0
    algo = AlgorithmConfig(dynamic_sampling=dynamic, max_sampling_rounds=limit)
    groups = GroupFilter(wanted, algo, ProcessGroup())
    rounds = []
    while not groups.full:
        batch, scores = _random_batch(gen, groups=wanted, group_size=g)
        flat = torch.rand(wanted, generator=gen) < 0.7  # most groups all equal: the limit is reached too
        rewards = torch.where(flat.repeat_interleave(g), 1.0, scores.rewards)
        rounds.append((batch, Scores(rewards, scores.results, verify_timeouts=scores.verify_timeouts)))
        groups.add(*rounds[-1])
    batch, scores, metrics = groups.result()
    informative = [
        (r, k) for r, (_, s) in enumerate(rounds) for k in range(wanted) if s.informative_groups(g)[k]
    ]
    others = [
        (r, k) for r, (_, s) in enumerate(rounds) for k in range(wanted) if not s.informative_groups(g)[k]
    ]
    if not dynamic:
        assert len(rounds) == 1 and batch is rounds[0][0] and scores is rounds[0][1]
        assert "dynamic_sampling/kept_groups" not in metrics
    else:
        # the first round after which enough groups differ, or the round limit
        enough = [r + 1 for r in range(len(rounds)) if len([x for x in informative if x[0] <= r]) >= wanted]
        assert len(rounds) == min([*enough, limit])
        chosen = (informative + others)[:wanted]
        expected = [i for r, k in chosen for i in range(k * g, (k + 1) * g)]
        sources = [r for r, k in chosen for _ in range(g)]
        assert scores.rewards.tolist() == [
            rounds[r][1].rewards[i].item() for r, i in zip(sources, expected, strict=True)
        ]
        assert batch.generations == [
            rounds[r][0].generations[i] for r, i in zip(sources, expected, strict=True)
        ]
        assert metrics["dynamic_sampling/kept_groups"] == min(len(informative), wanted)
        assert metrics["dynamic_sampling/rollout_batches"] == len(rounds)
    assert all(k.startswith("dynamic_sampling/") for k in metrics)
    assert groups.sampled == rounds  # what the trainer's reward metrics read


def test_stage_schedule_splits_the_steps_evenly():
    for stages, steps in [(1, 10), (2, 10), (3, 10), (4, 7), (3, 0)]:
        schedule = StageSchedule.even(stages, steps)
        assert schedule.ends[-1] == steps and len(schedule.ends) == stages
        assert sum(schedule.steps_of(k) for k in range(stages)) == steps
        assert all(abs(schedule.steps_of(k) - steps / stages) < 1 for k in range(stages))
    schedule = StageSchedule.even(2, 10)
    assert not schedule.advances_at(0, 4) and schedule.advances_at(0, 5) and not schedule.advances_at(1, 10)
    assert math.isclose(schedule.steps_of(1), 5)
