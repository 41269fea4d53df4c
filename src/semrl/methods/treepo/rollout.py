"""TreePO's segment-level tree sampling (arXiv 2508.17445 Alg. 1; docs/algorithms.md "TreePO").

Each prompt starts as ``branch`` copies. At every depth each active path samples one segment of at
most ``segment_length`` tokens. A path whose new segment ends it becomes a leaf; the survivors of a
prompt share the branching budget (``advantages.branch_budget``) and are copied for the next depth. A
prompt left with no active path and fewer than ``width`` leaves regrows from a random segment
boundary of a finished leaf (depth-first fallback), so that every prompt ends with exactly ``width``
leaves.

Scheduling (docs/engines.md, "Tree rollouts on the engines"). The budget rule reads every path of a
prompt's depth, so a prompt's depth waits for its own paths only: the moment its last segment comes
back, its next depth joins the engine's running batch (``Engine.generate_dynamic``), whatever the
other prompts are doing. Each segment draws from its own seed, derived from the prompt's seed and the
node's index in its tree (``rollout.seeds.node_seed``), and each prompt's fallback from its own stream, so a
tree's tokens do not depend on the batch limit or on the order in which requests finish.

Block alignment (``treepo.segment_alignment=block``). vLLM's prefix cache serves whole KV blocks of B
tokens and recomputes at least the last token of a context, so a branch whose context has L tokens
computes ``((L - 1) mod B) + 1`` of them again. Aligned segments are multiples of B, the first one
shortened by ``(P - 1) mod B`` tokens for a prompt of P tokens, so every branch's context has
L = 1 (mod B) and computes exactly one token; the last depth is lengthened by as much.

A leaf stops on, in this order (the official code's ``least_prioritized`` repetition policy):
a boxed answer and EOS in the segment (``finished``; with ``stop_on_boxed`` a boxed answer alone),
EOS (``eos``), the response budget (``max_length``), the depth limit (``max_depth``), a repeating
segment (``repetition``). Every leaf is trained on, whatever its reason.

Continuations reuse the parent's KV cache on the hf engine; vllm's prefix cache does it there. The
plumbing (requests, seeds, KV, leaves, the tree of the leaves) is the tree-rollout kit's
(``semrl.rollout.tree_kit``): a segment is a kit node continuing its path's last segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from semrl.methods.interface import RolloutContext
from semrl.methods.treepo import TreePOConfig, treepo_depth
from semrl.methods.treepo.advantages import branch_budget, has_repetition
from semrl.reward.extract import extract_boxed
from semrl.rollout.engines import Generation
from semrl.rollout.tree import ChainTree
from semrl.rollout.tree_kit import Node, TreeSampler, chain_tree

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
    block_size: int = 0  # > 0: block-aligned segments of this KV block size (see the module doc)

    @classmethod
    def of(cls, ctx: RolloutContext) -> SegmentTreeSettings:
        """The settings of a training rollout: the context's ``treepo`` options, ``rollout.group_size``
        leaves, and with ``segment_alignment=block`` the engine's KV block size."""
        options: TreePOConfig = ctx.config.options
        return cls(
            width=ctx.group_size,
            segment_length=options.segment_length,
            max_depth=treepo_depth(options, ctx.params.max_new_tokens),
            branch=options.branch,
            first_branch_max=options.first_branch_max,
            stop_on_boxed=options.stop_on_boxed,
            repetition_window=options.repetition_window,
            repetition_count=options.repetition_count,
            reuse_kv_cache=options.reuse_kv_cache,
            block_size=ctx.engine.powers.kv_block_size if options.segment_alignment == "block" else 0,
        )


def first_segment_length(settings: SegmentTreeSettings, prompt_length: int) -> int:
    """The first segment's budget: ``segment_length``, or with block alignment shortened by
    ``(prompt_length - 1) mod block_size`` so that every later context has length 1 (mod block)."""
    if not settings.block_size:
        return settings.segment_length
    if settings.segment_length % settings.block_size:
        raise ValueError(
            f"aligned segments need a segment length ({settings.segment_length}) that is a multiple of "
            f"the block size ({settings.block_size})"
        )
    return settings.segment_length - (prompt_length - 1) % settings.block_size


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
    """Per prompt, its ``width`` leaves in the order they stopped, their responses and their tree."""

    leaves: list[list[TreePath]]
    steps: int  # depth rounds of the deepest tree (the batched engine calls of a barrier per depth)
    fallbacks: int  # regrown copies over all prompts
    responses: list[list[Generation]] = field(default_factory=list)  # each leaf's whole response
    trees: list[ChainTree] = field(default_factory=list)  # each prompt's prefix tree of its leaves


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


class PromptTree:
    """One prompt's tree while it grows: which paths sample the next segment, and what each sampled
    segment does to the tree (a leaf or a survivor; the budget; the fallback).

    Drive it with ``budgets`` -> sample one segment per active path -> ``advance`` until ``done``.
    ``first_segment``: the budget of a path's first segment (``first_segment_length``).
    """

    def __init__(
        self,
        prompt: int,
        settings: SegmentTreeSettings,
        max_length: int,
        generator: torch.Generator | None = None,
        first_segment: int | None = None,
    ) -> None:
        self.prompt, self.settings, self.max_length, self.generator = prompt, settings, max_length, generator
        self.first_segment = settings.segment_length if first_segment is None else first_segment
        self.leaves: list[TreePath] = []
        self.next_node = self.steps = self.fallbacks = 0
        b = settings.branch
        first = b if settings.first_branch_max <= b else _randint(b, settings.first_branch_max, generator)
        self.active = [TreePath(prompt) for _ in range(min(first, settings.width))]

    @property
    def done(self) -> bool:
        return not self.active

    def budgets(self) -> list[int]:
        """(active paths) the tokens each may sample next: a segment, or what is left of the budget.
        Aligned trees (a shortened first segment) give the last depth all that is left."""
        s, out = self.settings, []
        shortened = s.segment_length - self.first_segment
        for path in self.active:
            left, depth = self.max_length - path.length, len(path.segments)
            if s.max_depth == 1:
                out.append(min(s.segment_length, left))
            elif depth == 0:
                out.append(min(self.first_segment, left))
            elif depth == s.max_depth - 1:  # the first segment's shortfall, so d segments still hold d x l
                out.append(min(s.segment_length + shortened, left))
            else:
                out.append(min(s.segment_length, left))
        return out

    def node_ids(self) -> list[int]:
        """(active paths) the node id each path's next segment gets."""
        return list(range(self.next_node, self.next_node + len(self.active)))

    def advance(self, segments: list[Generation], texts: list[str]) -> None:
        """Grow every active path by its sampled segment (decoded ``texts``), then make the next
        active set: the survivors' copies, or a fallback when none survived."""
        s, w, b = self.settings, self.settings.width, self.settings.branch
        if len(segments) != len(self.active) or len(texts) != len(self.active):
            raise ValueError(f"{len(segments)} segments and {len(texts)} texts for {len(self.active)} paths")
        self.steps += 1
        survivors: list[TreePath] = []
        finished_now = 0
        for path, out, text in zip(self.active, segments, texts, strict=True):
            grown = TreePath(self.prompt, [*path.segments, out], [*path.nodes, self.next_node])
            self.next_node += 1
            grown.reason = stop_reason(out, text, grown.length, len(grown.segments), self.max_length, s)
            if grown.reason is None:
                survivors.append(grown)
            else:
                self.leaves.append(grown)
                finished_now += 1
        if survivors:
            copies = branch_budget(w, len(self.leaves), finished_now, len(survivors), b)
            self.active = [path for path, n in zip(survivors, copies, strict=True) for _ in range(n)]
        elif len(self.leaves) < w:
            self.active = fallback_paths(self.leaves, w - len(self.leaves), b, self.prompt, self.generator)
            self.fallbacks += len(self.active)
        else:
            self.active = []


def segment_tree_rollout(
    ctx: RolloutContext, prompts: list[list[int]], settings: SegmentTreeSettings
) -> SegmentTreeRollout:
    """``settings.width`` leaves per prompt from TreePO's segment-level tree sampling, each prompt's
    next depth submitted the moment its previous one is back (no barrier across prompts).

    Args:
        ctx: the rollout's context: its engine; its sampler, whose ``max_new_tokens`` is the budget of a
            whole path; its prompts' seeds (drawn from its stream when it has none), from which a
            prompt's segments and fallback draw; and ``decode``, token ids -> text, for the
            boxed-answer and repetition tests.
        prompts: token ids of each prompt.
        settings: the tree's shape and stops (``SegmentTreeSettings.of(ctx)`` in training).
    """
    if ctx.decode is None:
        raise ValueError("TreePO's rollout needs RolloutContext.decode (its stop tests read segment text)")
    decode, params = ctx.decode, ctx.params
    kit = TreeSampler.from_context(ctx, prompts, reuse_kv_cache=settings.reuse_kv_cache)
    trees = [
        PromptTree(
            p,
            settings,
            params.max_new_tokens,
            kit.trees[p].stream(),
            first_segment_length(settings, len(prompts[p])),
        )
        for p in range(len(prompts))
    ]
    back: list[list[Generation | None]] = [[] for _ in prompts]  # the segments of a prompt's depth

    def depth_nodes(tree: PromptTree) -> list[Node]:
        """A node per active path (its node id its seed's key), continuing the path's last segment. A
        node of the last depth, or whose segment may reach the response budget, is a leaf whatever it
        samples (a fallback regrows from a segment before a leaf's last)."""
        nodes = kit.trees[tree.prompt]
        back[tree.prompt] = [None] * len(tree.active)
        paths = zip(tree.active, tree.budgets(), tree.node_ids(), strict=True)
        return [
            nodes.add(
                node,
                nodes.nodes[path.nodes[-1]] if path.nodes else None,
                budget=budget,
                data=i,
                leaf=len(path.segments) + 1 >= settings.max_depth
                or path.length + budget >= params.max_new_tokens,
            )
            for i, (path, budget, node) in enumerate(paths)
        ]

    def on_node(node: Node) -> list[Node]:
        p = node.prompt
        back[p][node.data] = node.out
        if any(g is None for g in back[p]):
            return []
        segments = [g for g in back[p] if g is not None]
        trees[p].advance(segments, [decode(g.token_ids.tolist()) for g in segments])
        # the depth's nodes have their children (or stopped): their KV goes once the children have it; a
        # fallback that regrows from an earlier segment later computes its context's tail (the plain path)
        kit.close(p)
        return [] if trees[p].done else depth_nodes(trees[p])

    kit.run([node for tree in trees for node in depth_nodes(tree)], on_node)
    leaves = [[kit.trees[t.prompt].nodes[leaf.nodes[-1]] for leaf in t.leaves] for t in trees]
    return SegmentTreeRollout(
        [tree.leaves for tree in trees],
        max(tree.steps for tree in trees),
        sum(t.fallbacks for t in trees),
        [[leaf.response() for leaf in group] for group in leaves],
        [chain_tree(group) for group in leaves],
    )


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
