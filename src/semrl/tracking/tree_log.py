"""Rollout trees written for the report's tree viewer (``trees.jsonl``, one line per prompt group).

Any method whose rollout records a ``ChainTree`` for every group (``GroupInfo.tree``) gets its trees
saved; ``GroupInfo.branch_points`` (optional) gives, per chain, the (H, SD, score) of the position it
branched at. A line::

    {"step", "problem_id", "problem", "gold",
     "chains": [{"chain", "parent", "branch_position", "length", "answer", "reward", "correct",
                 "branch": {"entropy", "divergence", "score"} | null,
                 "segments": [{"start", "end", "text", "advantage"}]}]}

``advantage`` is the mean of the segment's token advantages (constant within a segment unless
ROSE's length discount starts inside it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from semrl.reward import Scores
from semrl.rollout.batch import RolloutBatch
from semrl.rollout.tree import chain_segments

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def tree_records(
    batch: RolloutBatch,
    scores: Scores,
    advantages: torch.Tensor,
    tokenizer: PreTrainedTokenizerBase,
    step: int,
    max_groups: int,
) -> list[dict[str, Any]]:
    """Records of the first ``max_groups`` groups that have a tree; ``advantages`` is (N, T)."""
    trees = batch.trees()
    if not trees or max_groups <= 0:
        return []
    branch_points = [g.branch_points or (None,) * len(t) for g, t in zip(batch.groups, trees, strict=True)]
    records = []
    for g, (tree, points) in enumerate(zip(trees[:max_groups], branch_points, strict=False)):
        base = g * batch.group_size
        chains = []
        for c, segments in enumerate(chain_segments(tree, batch.groups[g].nodes_by_position)):
            row = base + c
            ids = batch.generations[row].token_ids
            point = points[c]
            chains.append(
                {
                    "chain": c,
                    "parent": tree.parents[c],
                    "branch_position": tree.branch_positions[c],
                    "length": tree.lengths[c],
                    "answer": scores.results[row].answer,
                    "reward": scores.rewards[row].item(),
                    "correct": scores.results[row].correct,
                    "branch": None
                    if point is None
                    else dict(zip(("entropy", "divergence", "score"), point, strict=True)),
                    "segments": [
                        {
                            "start": a,
                            "end": b,
                            "text": tokenizer.decode(ids[a:b], skip_special_tokens=True),
                            "advantage": advantages[row, a:b].mean().item(),
                        }
                        for a, b in segments
                    ],
                }
            )
        problem = batch.problems[base]
        records.append(
            {
                "step": step,
                "problem_id": problem.id,
                "problem": problem.problem,
                "gold": problem.answer,
                "chains": chains,
            }
        )
    return records
