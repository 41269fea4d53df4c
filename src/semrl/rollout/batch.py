"""One step's rollouts, and building a batch from chosen prompt groups (dynamic sampling)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from semrl.data import Problem
from semrl.reward import Scores
from semrl.rollout.engines import Generation
from semrl.rollout.sequences import SequenceBatch, make_sequence_batch
from semrl.rollout.tree import BranchPoint, ChainTree


@dataclass(frozen=True)
class GroupInfo:
    """What a method's rollout records about one prompt group; it follows its group when a batch
    is built from chosen groups (dynamic sampling).

    Attributes:
        tree: the prefix tree of the group's G chains (tree rollouts): tree packing and the tree
            log read it.
        branch_points: per chain, (H, SD, score) where it branched, or None (the tree log).
        nodes_by_position: the tree's nodes are keyed by (prompt, position) as in ROSE's code
            (``rose.code_compat``), not by the exact tree: the tree log's segments follow them.
        method_data: the method's own record (FR3E: the state each continuation starts from).
    """

    tree: ChainTree | None = None
    branch_points: tuple[BranchPoint | None, ...] | None = None
    nodes_by_position: bool = False
    method_data: Any = None


@dataclass
class RolloutBatch:
    """N = num_groups * group_size sequences, grouped by prompt (group g = rows g*G .. g*G+G-1).

    ``groups`` holds one ``GroupInfo`` per prompt group (empty ones for independent sampling);
    ``metrics`` the rollout's own metrics (e.g. ``rose/branched_chains``), logged with the step.
    """

    problems: list[Problem]  # (N,) the problem of each sequence
    prompt_ids: list[list[int]]  # (N,) prompt tokens of each sequence
    generations: list[Generation]  # (N,)
    texts: list[str]  # (N,) decoded responses
    group_size: int
    pad_token_id: int
    groups: list[GroupInfo] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sequences: SequenceBatch = make_sequence_batch(
            self.prompt_ids, [g.token_ids.tolist() for g in self.generations], self.pad_token_id
        )
        if not self.groups:
            self.groups = [GroupInfo() for _ in range(self.num_groups)]
        if len(self.groups) != self.num_groups:
            raise ValueError(f"{len(self.groups)} GroupInfo records for {self.num_groups} prompt groups")
        self.group_ids = torch.arange(self.num_groups).repeat_interleave(self.group_size)  # (N,)
        shape = self.sequences.response_mask.shape
        self.rollout_logprobs = torch.zeros(shape)  # (N, T) behaviour log-probs of the sampled tokens
        self.sampling_entropy = torch.zeros(shape)  # (N, T) full-vocabulary entropy at sampling time
        # False on an engine that returns no entropy (vllm): the update's forwards measure it
        self.has_sampling_entropy = all(g.entropy is not None for g in self.generations)
        for i, g in enumerate(self.generations):
            self.rollout_logprobs[i, : len(g.logprobs)] = g.logprobs
            if g.entropy is not None:
                self.sampling_entropy[i, : len(g.entropy)] = g.entropy

    @property
    def num_groups(self) -> int:
        return len(self.generations) // self.group_size

    def trees(self) -> list[ChainTree] | None:
        """One prefix tree per group, or None when the rollout made no trees."""
        trees = [g.tree for g in self.groups if g.tree is not None]
        return trees if len(trees) == len(self.groups) else None


@dataclass(frozen=True)
class CollectedStep:
    """What a step's rollout and reward stages return (``Trainer.collect``).

    Attributes:
        batch: the step's batch (with dynamic sampling, the kept groups of every round).
        scores: its scores.
        metrics: reward metrics over every sequence sampled (dropped groups too), dynamic sampling's
            counts and ``rollout/sampled_tokens``.
        rollout_s: seconds spent sampling, over every round.
        reward_s: seconds spent scoring, over every round.
    """

    batch: RolloutBatch
    scores: Scores
    metrics: dict[str, float]
    rollout_s: float
    reward_s: float


def gather_groups(chosen: list[tuple[RolloutBatch, Scores, int]]) -> tuple[RolloutBatch, Scores]:
    """A new batch, and its scores, made of the chosen (batch, its scores, group index) triples, in
    that order.

    Rollout metrics are averaged over the distinct batches the groups came from.
    """
    first = chosen[0][0]
    g = first.group_size
    rows = [(b, s, i) for b, s, grp in chosen for i in range(grp * g, (grp + 1) * g)]
    sources = list({id(b): b for b, _, _ in chosen}.values())
    metric_dicts = [b.metrics for b in sources if b.metrics]
    metrics = {}
    if metric_dicts:
        metrics = {k: sum(m[k] for m in metric_dicts) / len(metric_dicts) for k in metric_dicts[0]}
    batch = RolloutBatch(
        problems=[b.problems[i] for b, _, i in rows],
        prompt_ids=[b.prompt_ids[i] for b, _, i in rows],
        generations=[b.generations[i] for b, _, i in rows],
        texts=[b.texts[i] for b, _, i in rows],
        group_size=g,
        pad_token_id=first.pad_token_id,
        groups=[b.groups[grp] for b, _, grp in chosen],
        metrics=metrics,
    )
    scores = Scores(torch.stack([s.rewards[i] for _, s, i in rows]), tuple(s.results[i] for _, s, i in rows))
    return batch, scores
