"""One step's rollouts, and building a batch from chosen prompt groups (dynamic sampling)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from semrl.data import Problem
from semrl.engines import Generation
from semrl.forward import SequenceBatch, make_sequence_batch
from semrl.reward import RewardResult
from semrl.tree import BranchPoint, ChainTree


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
    rewards: torch.Tensor | None = None  # (N,) after the reward stage
    reward_results: list[RewardResult] = field(default_factory=list)  # (N,)
    verify_timeouts: int = 0  # verifier time-outs while scoring this batch
    # rewards/<function>/{sum,errors,timeouts}
    reward_function_sums: dict[str, float] = field(default_factory=dict)

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
        self.rollout_entropy = torch.zeros(shape)  # (N, T) full-vocabulary entropy at sampling time
        # False on an engine that returns no entropy (vllm): the trainer fills it from its forward pass
        self.has_rollout_entropy = all(g.entropy is not None for g in self.generations)
        for i, g in enumerate(self.generations):
            self.rollout_logprobs[i, : len(g.logprobs)] = g.logprobs
            if g.entropy is not None:
                self.rollout_entropy[i, : len(g.entropy)] = g.entropy

    def set_rollout_entropy(self, entropy: torch.Tensor) -> None:
        """Entropies computed after sampling, (N, T): into ``rollout_entropy`` and each generation."""
        self.rollout_entropy = entropy * self.sequences.response_mask
        for i, g in enumerate(self.generations):
            g.entropy = self.rollout_entropy[i, : len(g.token_ids)].clone()
        self.has_rollout_entropy = True

    @property
    def num_groups(self) -> int:
        return len(self.generations) // self.group_size

    def trees(self) -> list[ChainTree] | None:
        """One prefix tree per group, or None when the rollout made no trees."""
        trees = [g.tree for g in self.groups]
        return None if any(t is None for t in trees) else trees  # type: ignore[return-value]

    def group_rewards(self) -> torch.Tensor:
        """(num_groups, G) rewards."""
        assert self.rewards is not None, "reward stage has not run"
        return self.rewards.view(-1, self.group_size)

    def group_correct(self) -> torch.Tensor:
        """(num_groups, G) correctness as 0/1 (the reward without shaping or truncation overrides)."""
        return torch.tensor([float(r.correct) for r in self.reward_results]).view(-1, self.group_size)

    def informative_groups(self, metric: Literal["reward", "accuracy"] = "reward") -> torch.Tensor:
        """(num_groups,) True where the group's rewards (or correctness) are not all equal: the
        groups with a learning signal under group-relative advantages (DAPO's dynamic sampling)."""
        grouped = self.group_rewards() if metric == "reward" else self.group_correct()
        return grouped.max(1).values > grouped.min(1).values


def gather_groups(chosen: list[tuple[RolloutBatch, int]]) -> RolloutBatch:
    """A new batch made of the chosen (batch, group index) pairs, in that order.

    Rollout metrics are averaged over the distinct batches the groups came from.
    """
    first = chosen[0][0]
    g = first.group_size
    rows = [(b, i) for b, grp in chosen for i in range(grp * g, (grp + 1) * g)]
    sources = list({id(b): b for b, _ in chosen}.values())
    metric_dicts = [b.metrics for b in sources if b.metrics]
    metrics = {}
    if metric_dicts:
        metrics = {k: sum(m[k] for m in metric_dicts) / len(metric_dicts) for k in metric_dicts[0]}
    out = RolloutBatch(
        problems=[b.problems[i] for b, i in rows],
        prompt_ids=[b.prompt_ids[i] for b, i in rows],
        generations=[b.generations[i] for b, i in rows],
        texts=[b.texts[i] for b, i in rows],
        group_size=g,
        pad_token_id=first.pad_token_id,
        groups=[b.groups[grp] for b, grp in chosen],
        metrics=metrics,
    )
    if all(b.rewards is not None for b, _ in chosen):
        out.rewards = torch.stack([b.rewards[i] for b, i in rows])  # type: ignore[index]
        out.reward_results = [b.reward_results[i] for b, i in rows]
    return out
