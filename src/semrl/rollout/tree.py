"""The prefix tree of a group of chains: the one tree type of semrl.

Tree rollouts (ROSE) build it, tree packing computes each shared prefix once from it, the tree log
draws it, and ROSE's advantages are defined on its nodes (docs/algorithms.md, "ROSE: nodes and
segment advantages").

A group of G chains is described by, for every chain c (chains are numbered in creation order, so
a parent always precedes its children):
* ``parents[c]``: the chain it branched from, or -1 for the root chain and fresh (epsilon) chains;
* ``branch_positions[c]``: k, the number of response tokens copied from the parent (the token at
  index k is re-sampled); -1 for the root chain, 0 for fresh chains;
* ``lengths[c]``: its response length in tokens.

Exact tree (default): a node is a branch position k *together with* the set of chains that share
the first k tokens of the chain that branched there, so two branch points at the same index in
different sub-trees are different nodes. ``code_compat=True`` reproduces the ROSE code, which keys
nodes by (prompt, position) and propagates position sets along parents.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

# (H, SD, score) at the position a chain branched from, for the tree log
BranchPoint = tuple[float, float, float]


@dataclass(frozen=True)
class ChainTree:
    """The prefix tree of one group's G chains: per chain its parent (-1: none), the position it branched
    at, and its length (the module docstring defines them); checked on construction."""

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
                raise ValueError(
                    f"chain {c}: branch position {k} outside parent {p} (length {self.lengths[p]})"
                )

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
    points = [
        sorted({k for (k, members) in nodes if c in members and 0 < k < tree.lengths[c]}) for c in range(g)
    ]
    return points, nodes


def code_compat_node_sets(tree: ChainTree) -> list[set[int]]:
    """The ROSE code's per-chain position sets S_b
    (docs/algorithms.md, "ROSE: nodes and segment advantages")."""
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


def segments_between(points: list[int], length: int) -> list[tuple[int, int]]:
    cuts = sorted({0, length, *(k for k in points if 0 <= k <= length)})
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a]


def chain_segments(tree: ChainTree, code_compat: bool = False) -> list[list[tuple[int, int]]]:
    """Per chain, its segments [start, end) between the tree nodes it passes through."""
    if code_compat:
        points = [sorted(k for k in s if k != 0) for s in code_compat_node_sets(tree)]
    else:
        points = exact_node_points(tree)[0]
    return [segments_between(points[c], tree.lengths[c]) for c in range(len(tree))]
