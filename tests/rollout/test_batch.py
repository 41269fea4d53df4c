"""Building a batch from chosen prompt groups (dynamic sampling), without a model."""

import torch

from semrl.data import Problem
from semrl.reward import RewardResult, Scores
from semrl.rollout.batch import GroupInfo, RolloutBatch, gather_groups
from semrl.rollout.engines import Generation


def _batch(tag: str, rewards: list[float], group_size: int = 2) -> tuple[RolloutBatch, Scores]:
    n = len(rewards)
    gens = [
        Generation(
            token_ids=torch.full((i + 1,), 10 + i),
            logprobs=torch.zeros(i + 1),
            top_logprobs=torch.zeros(i + 1, 2),
            top_ids=torch.zeros(i + 1, 2, dtype=torch.long),
            entropy=torch.zeros(i + 1),
            finished=True,
        )
        for i in range(n)
    ]
    groups = n // group_size
    batch = RolloutBatch(
        problems=[Problem(f"{tag}{i // group_size}", "q", "1") for i in range(n)],
        prompt_ids=[[1, 2, 3][: 1 + i // group_size] for i in range(n)],
        generations=gens,
        texts=[f"{tag}-{i}" for i in range(n)],
        group_size=group_size,
        pad_token_id=0,
        groups=[GroupInfo(method_data=f"{tag}-group{g}") for g in range(groups)],
        metrics={"m": float(len(tag))},
    )
    return batch, Scores(torch.tensor(rewards), tuple(RewardResult(r, str(r), r > 0, False) for r in rewards))


def test_gather_groups_keeps_rows_and_per_group_records_together():
    a = _batch("a", [1.0, 0.0, 1.0, 1.0])  # group 0 informative, group 1 all equal
    b = _batch("bb", [0.0, 1.0, 0.0, 0.0])
    out, scores = gather_groups([(*a, 0), (*b, 0), (*a, 1)])
    assert out.num_groups == 3 and out.group_size == 2
    assert out.texts == ["a-0", "a-1", "bb-0", "bb-1", "a-2", "a-3"]
    assert scores.rewards.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert [r.reward for r in scores.results] == scores.rewards.tolist()
    assert [g.method_data for g in out.groups] == ["a-group0", "bb-group0", "a-group1"]
    assert out.metrics["m"] == 1.5  # averaged over the two source batches
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    # sequences are rebuilt for the chosen rows: response lengths 1, 2, 1, 2, 3, 4
    assert out.sequences.response_mask.sum(1).tolist() == [1, 2, 1, 2, 3, 4]
    assert scores.grouped(2).shape == (3, 2)
