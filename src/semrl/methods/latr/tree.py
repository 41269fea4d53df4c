"""LATR's pure parts (Lookahead Tree-Based Rollouts, arXiv 2510.24302; docs/algorithms.md "LATR"):
the fork test, the window similarities that prune a branch, the share of LATR rows per step, and
``LatrForest``, the trees of a batch during the lookahead phase.

The lookahead phase grows, per prompt, up to ``width`` rows token by token: each active row takes
the argmax of the raw next-token distribution, and forks a new row with the second token when
``p2 > tau_abs`` and ``p1 - p2 < tau_rel`` while the prompt has room. A row born ``r`` tokens ago (for
each lookahead length r) whose last r tokens stay too close to its parent's last r tokens is removed
with its descendants. The phase ends once the trees are (nearly) full and no row is younger than
the longest lookahead, or after a token limit; the rows are then finished by ordinary sampling.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# a fork whose parent token, stripped, is a substring of this is never pruned (the code's
# keep_math_symbols: whitespace, operators, brackets and digits carry the computation)
MATH_SYMBOLS = "+-*/\\<>=()[]{}_^&%$0123456789"


def forks(p1: float, p2: float, tau_abs: float, tau_rel: float) -> bool:
    """LATR's branching test (paper eq. 5, the code's ``ProbFilter`` since 2adb0ed) on the raw
    distribution's two most likely tokens: the second opens a branch iff ``p2 > tau_abs`` and
    ``p1 - p2 < tau_rel``."""
    return p2 > tau_abs and p1 - p2 < tau_rel


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance between two token sequences (insertions, deletions, substitutions)."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def _longest_suffix_inside(a: Sequence[int], b: Sequence[int]) -> int:
    """The largest L such that a's last L tokens occur contiguously somewhere in b."""
    text = tuple(b)
    best = 0
    for length in range(1, len(a) + 1):
        piece = tuple(a[len(a) - length :])
        if not any(text[i : i + length] == piece for i in range(len(text) - length + 1)):
            break
        best = length
    return best


def suffix_match(a: Sequence[int], b: Sequence[int]) -> float:
    """The longest suffix of either window found anywhere in the other, over the window length."""
    if len(a) != len(b) or not a:
        raise ValueError("suffix_match compares two windows of the same non-zero length")
    return max(_longest_suffix_inside(a, b), _longest_suffix_inside(b, a)) / len(a)


def rouge_l(a: Sequence[int], b: Sequence[int]) -> float:
    """ROUGE-L F: the harmonic mean of LCS / |a| and LCS / |b|."""
    if not a or not b:
        return 0.0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, 1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    lcs = previous[-1]
    precision, recall = lcs / len(a), lcs / len(b)
    return 0.0 if lcs == 0 else 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class PruneRule:
    """Thresholds of the window comparison; None turns a metric off. A branch goes when any
    enabled metric says its window repeats the parent's."""

    edit_distance: float | None = 0.4  # remove when distance / r < this
    suffix_match: float | None = None  # remove when the suffix match > this
    rouge_l: float | None = None  # remove when ROUGE-L F > this

    def too_similar(self, child: Sequence[int], parent: Sequence[int]) -> bool:
        r = len(child)
        if self.edit_distance is not None and edit_distance(child, parent) / r < self.edit_distance:
            return True
        if self.suffix_match is not None and suffix_match(child, parent) > self.suffix_match:
            return True
        return self.rouge_l is not None and rouge_l(child, parent) > self.rouge_l


def eta_at(step: int, steps: Sequence[int], values: Sequence[float]) -> float:
    """The share of LATR rows at a training step: the value of the last schedule step <= ``step``."""
    eta = values[0]
    for start, value in zip(steps, values, strict=True):
        if step >= start:
            eta = value
    return eta


def latr_width(group_size: int, eta: float) -> int:
    """Rows per prompt that LATR grows: ``round(n * eta)``, Python's round (half to even), as the code."""
    return round(group_size * eta)


@dataclass(eq=False)
class Branch:
    """One row of a prompt's tree during the lookahead phase; on an engine that streams, also its
    greedy request (``semrl.methods.latr.stream``)."""

    root: int  # the prompt
    tokens: list[int]
    logprobs: list[float]
    parent: Branch | None = None
    birth: int = 0  # the loop step of its fork (0 for the main row)
    fork_position: int = 0  # response tokens shared with the parent
    finished: bool = False  # sampled EOS
    # the engine's KV of this row: for its next step (hf), or its request's (streamed), which its forks
    # and its finishing request continue
    kv: Any = None
    stream: int = -1  # streamed: its request's key, -1 before it has one
    stream_start: int = 0  # streamed: the response position of its request's first token
    # streamed: the (top-2 ids, top-2 log-probs) its request returned for each position since
    # ``stream_start``, the sampled token first
    tops: list[tuple[tuple[int, int], tuple[float, float]]] = field(default_factory=list)


@dataclass(frozen=True)
class ForestSettings:
    """LATR's settings as the forest reads them: rows per prompt, the branching thresholds, the pruning
    rule, the lookahead windows and the return threshold's schedule (docs/methods/latr.md)."""

    width: int  # LATR rows per prompt, k
    tau_abs: float
    tau_rel: float
    prune: PruneRule
    windows: tuple[int, ...]  # lookahead lengths r
    keep_math_symbols: bool = True
    return_threshold: float = 0.98
    return_threshold_decay: float = 0.0


@dataclass
class LatrForest:
    """The trees of a batch of prompts during LATR's lookahead phase.

    Drive it with ``active`` -> one token each (top-2 of the raw distribution) -> ``advance`` until
    ``done``; ``trees[p]`` holds prompt p's rows in creation order (the main row first).
    """

    num_prompts: int
    settings: ForestSettings
    eos_ids: frozenset[int]
    decode: Callable[[list[int]], str]
    trees: list[list[Branch]] = field(default_factory=list)
    forks: int = 0
    pruned: int = 0
    suppressed: int = 0  # forks the width left no room for

    def __post_init__(self) -> None:
        self.trees = [[Branch(p, [], [])] for p in range(self.num_prompts)]

    def active(self) -> list[Branch]:
        """The rows that take a token at the next step, in prompt then creation order."""
        return [b for tree in self.trees for b in tree if not b.finished]

    def advance(
        self,
        step: int,
        rows: list[Branch],
        top_ids: list[tuple[int, int]],
        top_logprobs: list[tuple[float, float]],
        caches: list[Any] | None = None,
    ) -> None:
        """Loop step ``step``: every row of ``rows`` (``active()``) takes its argmax token; rows that
        pass the fork test open a branch with their second token while their prompt has room, the
        earlier rows first (the code's capacity order); then the rows born exactly r tokens ago are
        compared with their parents and pruned. ``caches``: each row's KV after this step (one
        request per row and token), which it and its fork continue; without it rows keep their own."""
        s = self.settings
        room = {p: s.width - len(tree) for p, tree in enumerate(self.trees)}
        born: list[Branch] = []
        for i, row in enumerate(rows):
            (first, second), (lp1, lp2) = top_ids[i], top_logprobs[i]
            cache = caches[i] if caches is not None else None
            if forks(math.exp(lp1), math.exp(lp2), s.tau_abs, s.tau_rel):
                if room[row.root] > 0:
                    room[row.root] -= 1
                    self.forks += 1
                    born.append(
                        Branch(
                            row.root,
                            [*row.tokens, second],
                            [*row.logprobs, lp2],
                            parent=row,
                            birth=step,
                            fork_position=len(row.tokens),
                            finished=second in self.eos_ids,
                            kv=cache,
                        )
                    )
                else:
                    self.suppressed += 1
            row.tokens.append(first)
            row.logprobs.append(lp1)
            row.finished = first in self.eos_ids
            if caches is not None:
                row.kv = cache
        for branch in born:
            self.trees[branch.root].append(branch)
        self._prune(step + 1)

    def _prune(self, current: int) -> None:
        s, doomed = self.settings, set()
        for tree in self.trees:
            for branch in tree:
                parent = branch.parent
                r = current - branch.birth
                if parent is None or r not in s.windows or branch.finished or parent.finished:
                    continue  # a window holding EOS is not compared
                fork_token = parent.tokens[branch.fork_position]
                if s.keep_math_symbols and self.decode([fork_token]).strip() in MATH_SYMBOLS:
                    continue
                if s.prune.too_similar(branch.tokens[-r:], parent.tokens[-r:]):
                    doomed.add(id(branch))
        if not doomed:
            return
        for p, tree in enumerate(self.trees):
            gone: set[int] = set()
            for branch in tree:  # parents precede children: descendants follow their ancestor
                if id(branch) in doomed or (branch.parent is not None and id(branch.parent) in gone):
                    gone.add(id(branch))
            self.pruned += len(gone)
            self.trees[p] = [b for b in tree if id(b) not in gone]

    def full(self, step: int, max_new_tokens: int) -> bool:
        """The code's early return after loop step ``step``: the trees' effective width (a tree whose
        rows all ended counts as full) reaches ``round(k B thres)``, thres decaying linearly over the
        response, and no row was born within the longest lookahead."""
        s = self.settings
        threshold = s.return_threshold - s.return_threshold_decay * step / max_new_tokens
        effective = sum(s.width if all(b.finished for b in tree) else len(tree) for tree in self.trees)
        if effective < round(s.width * self.num_prompts * threshold):
            return False
        return all(b.birth + max(s.windows) < step for tree in self.trees for b in tree)
