"""ROSE prefix trees and segment-level advantages, as pure functions over one prompt's group.

Definitions: ``shared/design/algorithms.md`` sections 1.3 (tree rollout), 1.4 (nodes, node values,
segment advantages; ROSE-paper eqs. 4-7) and 1.5 (length-aware calibration, eq. 8).

A group of G chains is described by, for every chain c (chains are numbered in creation order, so
a parent always precedes its children):
* ``parents[c]``: the chain it branched from, or -1 for the root chain and fresh (epsilon) chains;
* ``branch_positions[c]``: k, the number of response tokens copied from the parent (the token at
  index k is re-sampled); -1 for the root chain, 0 for fresh chains;
* ``lengths[c]``: its response length in tokens.

Exact tree (default): a node is a branch position k *together with* the set of chains that share
the first k tokens of the chain that branched there, so two branch points at the same index in
different sub-trees are different nodes. ``code_compat=True`` reproduces ROSE's code, which keys
nodes by (prompt, position) and propagates position sets along parents (section 1.4 steps 1-5).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class ChainTree:
    parents: tuple[int, ...]
    branch_positions: tuple[int, ...]
    lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        g = len(self.parents)
        if not (len(self.branch_positions) == len(self.lengths) == g):
            raise ValueError("parents, branch_positions and lengths must have one entry per chain")
        for c, (p, k) in enumerate(zip(self.parents, self.branch_positions, strict=True)):
            if p >= c:
                raise ValueError(f"chain {c}: parent {p} must be an earlier chain")
            if p >= 0 and not 0 <= k <= self.lengths[p]:
                raise ValueError(f"chain {c}: branch position {k} outside parent {p} (length {self.lengths[p]})")

    def __len__(self) -> int:
        return len(self.parents)

    def shared_prefix(self, a: int, b: int) -> int:
        """Tokens chains a and b share by construction (their longest common tree prefix)."""
        return _shared_prefix(self, a, b)


@lru_cache(maxsize=4096)
def _shared_prefix(tree: ChainTree, a: int, b: int) -> int:
    if a == b:
        return tree.lengths[a]
    if a < b:
        a, b = b, a
    parent = tree.parents[a]  # a is the younger chain
    if parent < 0:
        return 0
    return min(tree.branch_positions[a], _shared_prefix(tree, parent, b))


def exact_node_points(tree: ChainTree) -> tuple[list[list[int]], dict[tuple[int, frozenset[int]], None]]:
    """Node positions each chain passes through, and the set of exact nodes (k, members).

    Returns ``points[c]`` (sorted positions in (0, L_c) of the nodes chain c traverses) and the
    node table. Membership: chain m is in the node created where chain c branched at k iff m
    shares c's first k tokens.
    """
    g = len(tree)
    nodes: dict[tuple[int, frozenset[int]], None] = {}
    for c in range(g):
        if tree.parents[c] < 0:
            continue
        k = tree.branch_positions[c]
        members = frozenset(m for m in range(g) if tree.shared_prefix(m, c) >= k)
        nodes[(k, members)] = None
    points = [sorted({k for (k, members) in nodes if c in members and 0 < k < tree.lengths[c]}) for c in range(g)]
    return points, nodes


def code_compat_node_sets(tree: ChainTree) -> list[set[int]]:
    """ROSE code's per-chain position sets S_b (algorithms.md section 1.4, steps 1-3)."""
    g = len(tree)
    sets: list[set[int]] = []
    for c in range(g):  # step 1: own branch position and those of every ancestor
        s = {0}
        x = c
        while x >= 0:
            if tree.branch_positions[x] >= 0:
                s.add(tree.branch_positions[x])
            x = tree.parents[x]
        sets.append(s)
    for c in range(g):  # step 2: upward propagation while k lies on the shared prefix
        p, k = tree.parents[c], tree.branch_positions[c]
        x = p
        while x >= 0:
            sets[x].add(k)
            if tree.parents[x] >= 0 and k <= tree.branch_positions[x]:
                x = tree.parents[x]
            else:
                break
    for c in range(g):  # step 3: downward inheritance, parents first
        p = tree.parents[c]
        if p >= 0:
            sets[c] |= {k for k in sets[p] if k < tree.branch_positions[c]}
    return sets


def _segments(points: list[int], length: int) -> list[tuple[int, int]]:
    cuts = sorted({0, length, *(k for k in points if 0 <= k <= length)})
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a]


def chain_segments(tree: ChainTree, code_compat: bool = False) -> list[list[tuple[int, int]]]:
    """Per chain, its segments [start, end) between the tree nodes it passes through."""
    if code_compat:
        points = [sorted(k for k in s if k != 0) for s in code_compat_node_sets(tree)]
    else:
        points = exact_node_points(tree)[0]
    return [_segments(points[c], tree.lengths[c]) for c in range(len(tree))]


def segment_advantages(
    tree: ChainTree,
    rewards: torch.Tensor,
    width: int,
    *,
    alpha: float = 1.0,
    code_compat: bool = False,
    correct_eps: float = 1e-6,
) -> torch.Tensor:
    """ROSE advantages of one group: (G,) rewards -> (G, width) per-token advantages.

    Segment [b_j, b_{j+1}) of chain c gets V(b_{j+1}) - V(b_j), the last segment r_c - V(b_last);
    V(node) = mean reward of the chains through it and V(root) = mean of the group, so a chain's
    segment values telescope to r_c - mean(r) (the Dr.GRPO advantage). Then, if ``alpha > 0``,
    eq. 8: for every correct chain longer than the shortest correct one o_s, tokens after their
    divergence point k get ``A <- A - |A| * (1 - ((L_s - k) / (L_c - k)) ** alpha)``.
    Padding (t >= L_c) is 0.
    """
    g = len(tree)
    rewards = rewards.float()
    if rewards.shape != (g,):
        raise ValueError(f"rewards must have shape ({g},), got {tuple(rewards.shape)}")
    lengths = tree.lengths
    adv = torch.zeros(g, width)
    root_value = rewards.mean().item()

    if code_compat:
        sets = code_compat_node_sets(tree)
        all_points = sorted(set().union(*sets))
        value = {k: rewards[[b for b in range(g) if k in sets[b]]].mean().item() for k in all_points}
        value[0] = root_value
        chain_points = [sorted(k for k in s if k != 0) for s in sets]

        def node_value(c: int, k: int) -> float:
            return value[k]

        def divergence_point(a: int, b: int) -> int:  # deepest common position in both sets
            common = [k for k in sets[a] & sets[b] if k <= min(lengths[a], lengths[b])]
            return max(common) if common else 0
    else:
        points, nodes = exact_node_points(tree)
        chain_points = points
        member_of = {
            (c, k): members for (k, members) in nodes for c in members
        }  # unique per (chain, position): shared-prefix lengths form an ultrametric

        def node_value(c: int, k: int) -> float:
            return root_value if k == 0 else rewards[sorted(member_of[(c, k)])].mean().item()

        divergence_point = tree.shared_prefix

    for c in range(g):
        for start, end in _segments(chain_points[c], lengths[c]):
            end_value = rewards[c].item() if end == lengths[c] else node_value(c, end)
            adv[c, start:end] = end_value - node_value(c, start)

    if alpha > 0:
        correct = [c for c in range(g) if abs(rewards[c].item()) > correct_eps]
        if len(correct) >= 2:
            shortest = min(correct, key=lambda c: (lengths[c], c))
            for c in correct:
                if c == shortest:
                    continue
                k = divergence_point(shortest, c)
                adv[c] = length_discount(adv[c], lengths[c], lengths[shortest], k, alpha)
    return adv


def length_discount(adv: torch.Tensor, length: int, shortest: int, diverge: int, alpha: float) -> torch.Tensor:
    """Eq. 8 on one chain: (width,) -> (width,). Tokens in [diverge, length) get
    ``A - |A| * (1 - ((shortest - diverge) / (length - diverge)) ** alpha)`` when that factor > 0."""
    if length <= diverge:
        return adv
    factor = 1.0 - ((shortest - diverge) / (length - diverge)) ** alpha
    if factor <= 0:
        return adv
    out = adv.clone()
    out[diverge:length] = adv[diverge:length] - adv[diverge:length].abs() * factor
    return out
