"""TreePO's segment-level tree sampling (arXiv 2508.17445 Alg. 1; docs/algorithms.md "TreePO").

Each prompt starts as ``branch`` copies. At every step each active path samples one segment of at
most ``segment_length`` tokens (one batched engine call for all prompts). A path whose new segment
ends it becomes a leaf; the survivors of a prompt share the branching budget
(``advantages.branch_budget``) and are copied for the next step. A prompt left with no active path
and fewer than ``width`` leaves regrows from a random segment boundary of a finished leaf
(depth-first fallback), so that every prompt ends with exactly ``width`` leaves.

A leaf stops on, in this order (the official code's ``least_prioritized`` repetition policy):
a boxed answer and EOS in the segment (``finished``; with ``stop_on_boxed`` a boxed answer alone),
EOS (``eos``), the response budget (``max_length``), the depth limit (``max_depth``), a repeating
segment (``repetition``). Every leaf is trained on, whatever its reason.

Continuations reuse the parent's KV cache on the hf engine; vllm's prefix cache does it there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from semrl.methods.treepo.advantages import branch_budget, has_repetition
from semrl.reward.extract import extract_boxed
from semrl.rollout.engines import Engine, Generation, GenerationRequest, SamplingParams
from semrl.rollout.tree import ChainTree

STOP_REASONS = ("finished", "eos", "max_length", "max_depth", "repetition")
FALLBACK_REASONS = ("finished", "eos")  # the code's soft_boxed_and_eos: leaves a fallback regrows from


@dataclass(frozen=True)
class SegmentTreeSettings:
    """What the segment-tree sampler reads (the ``treepo`` section, where each is documented)."""

    width: int  # leaves per prompt (rollout.group_size)
    segment_length: int
    max_depth: int
    branch: int
    first_branch_max: int = 0  # > branch: the first fork draws U{branch .. this} per prompt
    stop_on_boxed: bool = False
    repetition_window: int = 32
    repetition_count: int = 8
    reuse_kv_cache: bool = True


@dataclass
class TreePath:
    """A path under construction or a leaf: its segments and their node ids."""

    prompt: int
    segments: list[Generation] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    reason: str | None = None  # why it stopped (a leaf), None while active

    @property
    def length(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids.tolist()]

    def cut(self, keep_segments: int) -> TreePath:
        """A new active path holding this one's first ``keep_segments`` segments."""
        return TreePath(self.prompt, self.segments[:keep_segments], self.nodes[:keep_segments])


@dataclass
class SegmentTreeRollout:
    """Per prompt, its ``width`` leaves in the order they stopped."""

    leaves: list[list[TreePath]]
    steps: int  # batched engine calls
    fallbacks: int  # regrown copies over all prompts


def stop_reason(
    segment: Generation, text: str, length: int, depth: int, max_length: int, settings: SegmentTreeSettings
) -> str | None:
    """Why a path ends with this new ``segment`` (decoded ``text``), or None to go on; ``length`` and
    ``depth`` are the path's response tokens and segments with it."""
    boxed = extract_boxed(text) is not None
    if boxed and (segment.finished or settings.stop_on_boxed):
        return "finished"
    if segment.finished:
        return "eos"
    if length >= max_length:
        return "max_length"
    if depth >= settings.max_depth:
        return "max_depth"
    if has_repetition(text, settings.repetition_window, settings.repetition_count):
        return "repetition"
    return None


def _randint(low: int, high: int, generator: torch.Generator | None) -> int:
    """Uniform on {low, ..., high}."""
    return int(torch.randint(low, high + 1, (1,), generator=generator))


class SegmentTree:
    """The trees of a batch of prompts while they grow: which paths sample the next segment, and
    what each sampled segment does to its tree (a leaf or a survivor; the budget; the fallback).

    Drive it with ``requests`` -> sample -> ``advance`` until ``done`` (``segment_tree_rollout``).
    """

    def __init__(
        self, num_prompts: int, settings: SegmentTreeSettings, max_length: int,
        generator: torch.Generator | None = None,
    ) -> None:
        self.settings, self.max_length, self.generator = settings, max_length, generator
        self.leaves: list[list[TreePath]] = [[] for _ in range(num_prompts)]
        self.next_node = [0] * num_prompts
        self.steps = self.fallbacks = 0
        self.active: list[TreePath] = []
        b = settings.branch
        for p in range(num_prompts):
            first = b if settings.first_branch_max <= b else _randint(b, settings.first_branch_max, generator)
            self.active += [TreePath(p) for _ in range(min(first, settings.width))]

    @property
    def done(self) -> bool:
        return not self.active

    def budgets(self) -> list[int]:
        """(active paths) the tokens each may sample next: a segment, or what is left of the budget."""
        return [min(self.settings.segment_length, self.max_length - path.length) for path in self.active]

    def advance(self, segments: list[Generation], texts: list[str]) -> None:
        """Grow every active path by its sampled segment (decoded ``texts``), then make the next
        active set: the survivors' copies, or a fallback for a prompt with none left."""
        s, w, b = self.settings, self.settings.width, self.settings.branch
        if len(segments) != len(self.active) or len(texts) != len(self.active):
            raise ValueError(f"{len(segments)} segments and {len(texts)} texts for {len(self.active)} paths")
        self.steps += 1
        survivors: dict[int, list[TreePath]] = {p: [] for p in range(len(self.leaves))}
        finished_now: Counter[int] = Counter()
        for path, out, text in zip(self.active, segments, texts, strict=True):
            p = path.prompt
            grown = TreePath(p, [*path.segments, out], [*path.nodes, self.next_node[p]])
            self.next_node[p] += 1
            grown.reason = stop_reason(out, text, grown.length, len(grown.segments), self.max_length, s)
            if grown.reason is None:
                survivors[p].append(grown)
            else:
                self.leaves[p].append(grown)
                finished_now[p] += 1
        self.active = []
        for p, paths in survivors.items():
            if paths:
                copies = branch_budget(w, len(self.leaves[p]), finished_now[p], len(paths), b)
                self.active += [path for path, n in zip(paths, copies, strict=True) for _ in range(n)]
            elif len(self.leaves[p]) < w:
                regrown = fallback_paths(self.leaves[p], w - len(self.leaves[p]), b, p, self.generator)
                self.fallbacks += len(regrown)
                self.active += regrown


def segment_tree_rollout(
    engine: Engine,
    prompts: list[list[int]],
    params: SamplingParams,
    settings: SegmentTreeSettings,
    decode: Callable[[list[int]], str],
    generator: torch.Generator | None = None,
) -> SegmentTreeRollout:
    """``settings.width`` leaves per prompt from TreePO's segment-level tree sampling.

    Args:
        prompts: token ids of each prompt.
        params: the sampler; ``max_new_tokens`` is the response budget of a whole path.
        decode: token ids -> text (the boxed-answer and repetition tests read a segment's text).
    """
    trees = SegmentTree(len(prompts), settings, params.max_new_tokens, generator)
    while not trees.done:
        requests = []
        for path, budget in zip(trees.active, trees.budgets(), strict=True):
            last = path.segments[-1] if path.segments else None
            requests.append(GenerationRequest(
                prompts[path.prompt], path.token_ids(), max_new_tokens=budget,
                cache=last.cache if last is not None and settings.reuse_kv_cache else None,
            ))
        outs = engine.generate(requests, params, generator, return_cache=settings.reuse_kv_cache)
        trees.advance(outs, [decode(out.token_ids.tolist()) for out in outs])
    for prompt_leaves in trees.leaves:
        for leaf in prompt_leaves:
            for segment in leaf.segments:
                segment.cache = None  # the trees are complete: free the KV memory
    return SegmentTreeRollout(trees.leaves, trees.steps, trees.fallbacks)


def fallback_paths(
    leaves: list[TreePath], remaining: int, branch: int, prompt: int, generator: torch.Generator | None
) -> list[TreePath]:
    """The depth-first fallback of a prompt with no active path and ``remaining`` leaves to go.

    Candidates are its leaves that stopped on an answer or EOS, in random order (none: the prompt
    itself). Each is cut at a uniformly random segment boundary (0 = regrow from the prompt; the
    official code's ``random`` policy with its window equal to the segment length, so a cut never
    splits a segment) and gives ``min(branch, remaining)`` copies, until ``remaining`` is spent.
    """
    candidates = [leaf for leaf in leaves if leaf.reason in FALLBACK_REASONS]
    order = torch.randperm(len(candidates), generator=generator).tolist()
    out: list[TreePath] = []
    for leaf in [candidates[i] for i in order] or [None]:
        if remaining == 0:
            break
        keep = 0 if leaf is None else _randint(0, len(leaf.segments) - 1, generator)
        start = TreePath(prompt) if leaf is None else leaf.cut(keep)
        copies = min(branch, remaining)
        out += [TreePath(prompt, list(start.segments), list(start.nodes)) for _ in range(copies)]
        remaining -= copies
    return out


def leaf_tree(leaves: list[TreePath]) -> ChainTree:
    """The prefix tree of a prompt's leaves for tree packing and the tree log: each leaf's parent is
    the earlier leaf it shares the most segments with, its branch position their shared tokens."""
    parents, positions = [], []
    for c, leaf in enumerate(leaves):
        best, shared = -1, 0
        for e in range(c):
            n = 0
            while n < min(len(leaf.nodes), len(leaves[e].nodes)) and leaf.nodes[n] == leaves[e].nodes[n]:
                n += 1
            if n > shared:
                best, shared = e, n
        parents.append(best)
        if best >= 0:
            positions.append(sum(len(s.token_ids) for s in leaf.segments[:shared]))
        else:
            positions.append(-1 if c == 0 else 0)  # the first leaf, or a leaf sharing no segment
    return ChainTree(tuple(parents), tuple(positions), tuple(leaf.length for leaf in leaves))
