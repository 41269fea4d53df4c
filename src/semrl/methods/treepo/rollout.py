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
from semrl.rollout.tree_kit import Node, PromptNodes, TreeSampler, chain_tree

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


def segments(node: Node | None) -> list[Node]:
    """The segments of the path that ends with ``node``, first to last (none for None, the prompt):
    its node and the nodes it continues."""
    chain: list[Node] = []
    while node is not None:
        chain.append(node)
        node = node.parent
    return chain[::-1]


@dataclass
class SegmentTreeRollout:
    """Per prompt, its ``width`` leaves in the order they stopped (kit nodes, each the last segment of
    its path, ``Node.data`` why it stopped), their responses and their tree."""

    leaves: list[list[Node]]
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

    A path is the kit node of its last segment (``segments``); a leaf's ``Node.data`` says why it
    stopped. Drive it with ``grow`` (a node per active path, in the prompt's kit tree ``nodes``) ->
    sample each node's ``out`` -> ``advance`` until ``done``. ``first_segment``: the budget of a
    path's first segment (``first_segment_length``).
    """

    def __init__(
        self,
        nodes: PromptNodes,
        settings: SegmentTreeSettings,
        max_length: int,
        generator: torch.Generator | None = None,
        first_segment: int | None = None,
    ) -> None:
        self.nodes, self.settings, self.max_length, self.generator = nodes, settings, max_length, generator
        self.first_segment = settings.segment_length if first_segment is None else first_segment
        self.leaves: list[Node] = []
        self.sampling: list[Node] = []  # the depth being sampled: a node per active path
        self.steps = self.fallbacks = 0
        b = settings.branch
        first = b if settings.first_branch_max <= b else _randint(b, settings.first_branch_max, generator)
        # what each active path continues: a segment's node, or None (the prompt)
        self.active: list[Node | None] = [None] * min(first, settings.width)

    @property
    def done(self) -> bool:
        return not self.active

    def budget(self, depth: int, length: int) -> int:
        """The tokens a path of ``depth`` segments and ``length`` tokens may sample next: a segment, or
        what is left of the budget. Aligned trees (a shortened first segment) give the last depth all
        that is left."""
        s, left = self.settings, self.max_length - length
        if s.max_depth == 1:
            return min(s.segment_length, left)
        if depth == 0:
            return min(self.first_segment, left)
        if depth == s.max_depth - 1:  # the first segment's shortfall, so d segments still hold d x l
            return min(s.segment_length + s.segment_length - self.first_segment, left)
        return min(s.segment_length, left)

    def grow(self) -> list[Node]:
        """The next depth: a new kit node per active path (indices in order, each its seed's key),
        continuing the path's last segment. A node of the last depth, or whose segment may reach the
        response budget, is a leaf whatever it samples (a fallback regrows from a segment before a
        leaf's last)."""
        self.sampling = []
        for parent in self.active:
            depth = len(segments(parent))
            length = 0 if parent is None else len(parent.response().token_ids)
            budget = self.budget(depth, length)
            leaf = depth + 1 >= self.settings.max_depth or length + budget >= self.max_length
            self.sampling.append(self.nodes.add(len(self.nodes.nodes), parent, budget=budget, leaf=leaf))
        return self.sampling

    def advance(self, texts: list[str]) -> None:
        """Every node of the depth ``grow`` made is sampled (decoded ``texts``): each becomes a leaf or
        a survivor, then the next active set is the survivors' copies, or a fallback when none
        survived."""
        s, w, b = self.settings, self.settings.width, self.settings.branch
        if len(texts) != len(self.sampling) or not all(node.done for node in self.sampling):
            raise ValueError(f"{len(texts)} texts for {len(self.sampling)} nodes, all sampled")
        self.steps += 1
        survivors: list[Node] = []
        finished_now = 0
        for node, text in zip(self.sampling, texts, strict=True):
            assert node.out is not None
            length = len(node.response().token_ids)
            node.data = stop_reason(node.out, text, length, len(segments(node)), self.max_length, s)
            if node.data is None:
                survivors.append(node)
            else:
                self.leaves.append(node)
                finished_now += 1
        if survivors:
            copies = branch_budget(w, len(self.leaves), finished_now, len(survivors), b)
            self.active = [node for node, n in zip(survivors, copies, strict=True) for _ in range(n)]
        elif len(self.leaves) < w:
            self.active = fallback_paths(self.leaves, w - len(self.leaves), b, self.generator)
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
    decode = ctx.decode
    kit = TreeSampler.from_context(ctx, prompts, reuse_kv_cache=settings.reuse_kv_cache)
    trees = [
        PromptTree(
            kit.trees[p],
            settings,
            ctx.params.max_new_tokens,
            kit.trees[p].stream(),
            first_segment_length(settings, len(prompts[p])),
        )
        for p in range(len(prompts))
    ]

    def on_node(node: Node) -> list[Node]:
        tree = trees[node.prompt]
        if not all(n.done for n in tree.sampling):
            return []
        tree.advance([decode(n.out.token_ids.tolist()) for n in tree.sampling if n.out is not None])
        # the depth's nodes have their children (or stopped): their KV goes once the children have it; a
        # fallback that regrows from an earlier segment later computes its context's tail (the plain path)
        kit.close(node.prompt)
        return tree.grow()

    kit.run([node for tree in trees for node in tree.grow()], on_node)
    return SegmentTreeRollout(
        [tree.leaves for tree in trees],
        max(tree.steps for tree in trees),
        sum(t.fallbacks for t in trees),
        [[leaf.response() for leaf in tree.leaves] for tree in trees],
        [chain_tree(tree.leaves) for tree in trees],
    )


def fallback_paths(
    leaves: list[Node], remaining: int, branch: int, generator: torch.Generator | None
) -> list[Node | None]:
    """The depth-first fallback of a prompt with no active path and ``remaining`` leaves to go: what
    each new path continues (a segment's node, or None: the prompt).

    Candidates are its leaves that stopped on an answer or EOS (``Node.data``), in random order (none:
    the prompt itself). Each is cut at a uniformly random segment boundary (0 = regrow from the prompt;
    the official code's ``random`` policy with its window equal to the segment length, so a cut never
    splits a segment) and gives ``min(branch, remaining)`` copies, until ``remaining`` is spent.
    """
    candidates = [leaf for leaf in leaves if leaf.data in FALLBACK_REASONS]
    order = torch.randperm(len(candidates), generator=generator).tolist()
    out: list[Node | None] = []
    for leaf in [candidates[i] for i in order] or [None]:
        if remaining == 0:
            break
        path = segments(leaf)
        keep = 0 if leaf is None else _randint(0, len(path) - 1, generator)
        copies = min(branch, remaining)
        out += [path[keep - 1] if keep else None] * copies
        remaining -= copies
    return out
