"""The tree-rollout kit: the plumbing ROSE, TreePO, LATR and FR3E share (docs/engines.md, "Tree
rollouts on the engines"; docs/methods/adding.md, "A tree method").

A tree rollout grows, per prompt, a tree of *nodes*. A node is one request: its context is the prompt
and the first ``position`` response tokens of its parent node, and it samples tokens of its own. A
method keeps only its policy (where to branch, what to sample, when to stop); the kit owns, once:

* the nodes of each prompt's tree and their seeds: node ``i`` of a prompt draws from
  ``node_seed(prompt seed, i)``, ``i`` fixed by the method's rule, never by completion order;
* submission: ``TreeSampler.run`` turns nodes into requests, hands every finished node to the
  method's callback and submits the nodes it returns at once (``Engine.generate_dynamic``, or
  ``Engine.generate_streaming`` beside streamed requests);
* forks: a child names its parent node and the position it continues from; with the engine's fork
  power (``EnginePowers.fork``; hf: the parent's ``PrefixCache``, KV rows duplicated) only the
  context's uncached tail is computed;
* leaves: ``Node.response`` joins the parent's first ``position`` tokens and the node's own, one way;
* KV lifetime: a node's KV is kept while it can still have children; ``TreeSampler.close`` lets go of
  a finished prompt's, and ``run`` lets go of every node's when it ends, on errors too;
* the entropy backfill (``TreeSampler.with_entropy``) and the ``ChainTree`` of a prompt's leaves
  (``chain_tree``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from semrl.rollout.engines.base import (
    Engine,
    Generation,
    GenerationRequest,
    KVHandle,
    OnDone,
    SamplingParams,
    join_generations,
    require_power,
)
from semrl.rollout.seeds import check_seed_count, node_seed, prompt_generator
from semrl.rollout.tree import ChainTree

# what a method uses; the rest is the kit's own
__all__ = [
    "Node",
    "OnNode",
    "OnStream",
    "PromptNodes",
    "RolloutInputs",
    "SamplingEntropyFn",
    "TreeSampler",
    "chain_tree",
    "given",
    "head",
    "shared_tokens",
]

# (contexts, generations) -> the generations with their entropy: new objects where it was None, with
# the full-vocabulary entropy at the weights that sampled them; contexts[i] holds the tokens before
# generations[i] (``semrl.update.row_logprobs.with_sampling_entropy``, bound by the trainer)
SamplingEntropyFn = Callable[[list[list[int]], list[Generation]], list[Generation]]


@dataclass(eq=False)
class Node:
    """One request of a prompt's tree, or tokens given to it (LATR's lookahead rows).

    Attributes:
        prompt: the prompt's index in the rollout.
        index: its place in the prompt's tree, fixed by the method's rule: the key of its seed.
        parent: the node whose response it continues, or None (it starts at the prompt).
        position: response tokens of ``parent.response()`` it continues from (0 for a root).
        budget: new tokens it may sample; None: the response budget left after its prefix.
        data: the method's own record of it.
        out: its own tokens once sampled (or given): (L,) tensors, see ``Generation``.
        kv: KV of its context and its tokens, while it can still have children (engines with the fork
            power: hf's copy, or vllm's held blocks); None once let go.
        leaf: the method gives it no child whatever it samples: its KV is never kept (on vllm its
            blocks would take the hold budget, half the KV cache, from nodes that have children).
        entropy: the method reads its entropy (``TreeSampler.with_entropy``): the engine is asked to
            record it while sampling (``GenerationRequest.entropy``).
    """

    prompt: int
    index: int
    parent: Node | None = None
    position: int = 0
    budget: int | None = None
    data: Any = None
    out: Generation | None = None
    kv: KVHandle | None = None
    leaf: bool = False
    entropy: bool = False
    _response: Generation | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.out is not None

    def response(self) -> Generation:
        """The whole response up to this node's end: the parent's first ``position`` tokens, then its
        own (entropy only when both pieces have one; finished when its own piece is)."""
        if self.out is None:
            raise ValueError(f"node {self.index} of prompt {self.prompt} has not been sampled")
        if self._response is None:
            if self.parent is None:
                self._response = self.out
            else:
                self._response = join_generations([head(self.parent.response(), self.position), self.out])
        return self._response

    def prefix_ids(self) -> list[int]:
        """The response tokens before its own (its parent's first ``position``)."""
        return [] if self.parent is None else self.parent.response().token_ids[: self.position].tolist()

    def pieces(self) -> list[tuple[Node, int, int]]:
        """Where its response's tokens were sampled: (node, start, end) in response positions."""
        if self.out is None:
            raise ValueError(f"node {self.index} of prompt {self.prompt} has not been sampled")
        own = (self, self.position, self.position + len(self.out.token_ids))
        if self.parent is None:
            return [own]
        kept = [(n, s, min(e, self.position)) for n, s, e in self.parent.pieces() if s < self.position]
        return [*kept, own]


def head(generation: Generation, length: int) -> Generation:
    """The first ``length`` tokens of ``generation`` (its end: whether the whole of it ended)."""
    return Generation(
        token_ids=generation.token_ids[:length],
        logprobs=generation.logprobs[:length],
        top_logprobs=generation.top_logprobs[:length],
        top_ids=generation.top_ids[:length],
        entropy=None if generation.entropy is None else generation.entropy[:length],
        finished=generation.finished,
    )


def given(tokens: Sequence[int], logprobs: Sequence[float], finished: bool, top_k: int) -> Generation:
    """A ``Generation`` of tokens chosen outside the engine's sampler (LATR's lookahead): their
    log-probs, and no top-k or entropy (zeros in the top-k tables)."""
    return Generation(
        token_ids=torch.tensor(list(tokens), dtype=torch.long),
        logprobs=torch.tensor(list(logprobs)),
        top_logprobs=torch.zeros(len(tokens), top_k),
        top_ids=torch.zeros(len(tokens), top_k, dtype=torch.long),
        entropy=None,
        finished=finished,
    )


def shared_tokens(a: Node, b: Node) -> int:
    """Response tokens two nodes' responses share by construction (sampled once, on a common path)."""
    n = 0
    for (x, s, e), (y, t, f) in zip(a.pieces(), b.pieces(), strict=False):
        if x is not y or s != t:
            break
        n = min(e, f)
        if e != f:
            break
    return n


def chain_tree(leaves: Sequence[Node], parents: Sequence[int] | None = None) -> ChainTree:
    """The prefix tree of a prompt's leaves (``semrl.rollout.tree``). Each leaf's parent is
    ``parents[c]`` when given (ROSE: the chain it branched from), else the earliest leaf it shares the
    most tokens with; its branch position is the tokens they share. A leaf with no parent is at -1
    (the first leaf) or 0."""
    out_parents, positions = [], []
    for c, leaf in enumerate(leaves):
        if parents is not None:
            best = parents[c]
            shared = shared_tokens(leaf, leaves[best]) if best >= 0 else 0
        else:
            best, shared = -1, 0
            for e in range(c):
                n = shared_tokens(leaf, leaves[e])
                if n > shared:
                    best, shared = e, n
        out_parents.append(best)
        positions.append(shared if best >= 0 else (-1 if c == 0 else 0))
    lengths = tuple(len(leaf.response().token_ids) for leaf in leaves)
    return ChainTree(tuple(out_parents), tuple(positions), lengths)


class PromptNodes:
    """One prompt's tree: its nodes by index, each index (its seed's key) used once."""

    def __init__(self, prompt: int, prompt_ids: list[int], seed: int | None) -> None:
        self.prompt, self.prompt_ids, self.seed = prompt, prompt_ids, seed
        self.nodes: dict[int, Node] = {}

    def stream(self) -> torch.Generator:
        """A new random stream from the prompt's seed: the method's own draws for this prompt."""
        assert self.seed is not None, "a prompt's stream needs its seed (TreeSampler.from_context)"
        return prompt_generator(self.seed)

    def add(
        self,
        index: int,
        parent: Node | None = None,
        position: int | None = None,
        budget: int | None = None,
        data: Any = None,
        out: Generation | None = None,
        leaf: bool = False,
        entropy: bool = False,
        kv: KVHandle | None = None,
    ) -> Node:
        """A new node: ``index`` its seed's key; ``position`` in ``parent``'s response (default: all
        of it); ``out``: tokens given, not sampled, with ``kv`` the KV of their context (the kit's to
        let go of); ``leaf``: it will have no child; ``entropy``: the method reads its entropy."""
        if index in self.nodes:
            raise ValueError(f"prompt {self.prompt} already has a node {index}: a node index is its seed")
        if parent is not None and parent.prompt != self.prompt:
            raise ValueError(f"node {index} of prompt {self.prompt} continues prompt {parent.prompt}'s node")
        if parent is None:
            position = 0
        elif position is None:
            position = len(parent.response().token_ids)
        elif not 0 <= position <= len(parent.response().token_ids):
            raise ValueError(f"node {index} continues its parent at {position}, outside its response")
        self.nodes[index] = Node(self.prompt, index, parent, position, budget, data, out, kv, leaf, entropy)
        return self.nodes[index]

    def release(self, engine: Engine) -> None:
        """Let go of every node's KV (``Engine.release_kv``): no node of this prompt can have children
        any more."""
        for node in self.nodes.values():
            if node.kv is not None:
                kv, node.kv = node.kv, None
                engine.release_kv(kv)


# the method's callback: a finished node -> the nodes to sample next
OnNode = Callable[[Node], list[Node]]
# streamed requests (LATR): one engine step's pieces -> (nodes or streamed requests to start, tags to stop)
OnStream = Callable[[list[tuple[Any, Generation]]], tuple[list[Any], list[Any]]]


class RolloutInputs(Protocol):
    """What ``TreeSampler.from_context`` reads of a method's rollout context
    (``semrl.methods.interface.RolloutContext``)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def params(self) -> SamplingParams: ...

    @property
    def generator(self) -> torch.Generator: ...

    @property
    def sampling_entropy(self) -> SamplingEntropyFn | None: ...

    def seeds_of_prompts(self, count: int) -> list[int]: ...


class TreeSampler:
    """The trees of one rollout and the engine calls that grow them.

    Args:
        engine: the sampling engine.
        prompts: token ids of each prompt.
        params: the sampler; ``max_new_tokens`` is a whole response's budget.
        generator: draws a request's seed when its prompt has none.
        prompt_seeds: one seed per prompt (node ``i`` draws from ``node_seed(seed, i)``), or None:
            every request's seed comes from ``generator`` in submission order.
        reuse_kv_cache: a child continues its parent's KV (``EnginePowers.fork``); an engine without
            the power ignores it.
        sampling_entropy: adds the full-vocabulary entropy to a node an engine sampled without it.
    """

    def __init__(
        self,
        engine: Engine,
        prompts: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None,
        prompt_seeds: list[int] | None = None,
        reuse_kv_cache: bool = False,
        sampling_entropy: SamplingEntropyFn | None = None,
        reads_entropy: str | None = None,
    ) -> None:
        check_seed_count(prompt_seeds, len(prompts))
        if reads_entropy and not engine.powers.computes_entropy and sampling_entropy is None:
            raise ValueError(  # before anything is sampled, not at the first node that needs it
                f"{reads_entropy} on the {engine.name} engine, which computes no entropy: pass "
                "sampling_entropy (the trainer's RolloutContext.sampling_entropy)"
            )
        self.engine, self.params, self.generator = engine, params, generator
        self.reuse_kv_cache = reuse_kv_cache and engine.powers.fork
        self.sampling_entropy = sampling_entropy
        self._closing: set[int] = set()
        seeds: Sequence[int | None] = prompt_seeds if prompt_seeds is not None else [None] * len(prompts)
        self.trees = [
            PromptNodes(p, ids, seed) for p, (ids, seed) in enumerate(zip(prompts, seeds, strict=True))
        ]

    @classmethod
    def from_context(
        cls,
        ctx: RolloutInputs,
        prompts: list[list[int]],
        *,
        reuse_kv_cache: bool = False,
        reads_entropy: str | None = None,
    ) -> TreeSampler:
        """The sampler of a method's rollout: the context's engine, sampler, random stream, prompt
        seeds (drawn from the stream when it has none) and entropy forward."""
        seeds = ctx.seeds_of_prompts(len(prompts))
        return cls(
            ctx.engine,
            prompts,
            ctx.params,
            ctx.generator,
            seeds,
            reuse_kv_cache=reuse_kv_cache,
            sampling_entropy=ctx.sampling_entropy,
            reads_entropy=reads_entropy,
        )

    def request(self, node: Node) -> GenerationRequest:
        """The request that samples ``node``: its prompt, its parent's first ``position`` tokens, its
        budget, its parent's KV (with ``reuse_kv_cache``), its seed, and whether its own KV may be kept."""
        tree = self.trees[node.prompt]
        budget = node.budget if node.budget is not None else self.params.max_new_tokens - node.position
        parent = node.parent
        return GenerationRequest(
            tree.prompt_ids,
            node.prefix_ids(),
            max_new_tokens=budget,
            cache=parent.kv if parent is not None and self.reuse_kv_cache else None,
            seed=None if tree.seed is None else node_seed(tree.seed, node.index),
            keep_kv=not node.leaf,
            entropy=node.entropy,
        )

    def context(self, node: Node) -> list[int]:
        """The tokens before ``node``'s own: its prompt and prefix."""
        return self.trees[node.prompt].prompt_ids + node.prefix_ids()

    def with_entropy(self, node: Node) -> Generation:
        """``node``'s tokens with their full-vocabulary entropy: the engine's (a node added with
        ``entropy=True`` asks vllm to record it), else from ``sampling_entropy``; kept on the node."""
        assert node.out is not None, "a node is given its entropy once it is sampled"
        if node.out.entropy is None:
            if self.sampling_entropy is None:
                raise ValueError(
                    f"the {self.engine.name} engine computes no entropy: pass sampling_entropy "
                    "(the trainer's RolloutContext.sampling_entropy)"
                )
            node.out = self.sampling_entropy([self.context(node)], [node.out])[0]
            node._response = None
        return node.out

    def run(self, first: list[Node], on_node: OnNode) -> int:
        """Sample ``first`` and everything the callbacks start; returns the engine's batched calls.
        Each finished node goes to ``on_node``, which returns the nodes to sample next; a request's tag
        is its node's (prompt, index). Every node's KV is let go when the call ends, whether it
        returns or raises."""
        with self._released():
            return self.engine.generate_dynamic(
                [self.pair(n) for n in first],
                self.params,
                self.generator,
                self._done(on_node),
                self.reuse_kv_cache,
            )

    def run_streaming(
        self,
        first: list[Node],
        on_node: OnNode,
        on_stream: OnStream,
        stream_params: SamplingParams,
        streamed: list[tuple[Any, GenerationRequest]],
    ) -> int:
        """``run``, with requests streamed beside the nodes (``Engine.generate_streaming``): the
        ``streamed`` (tag, request) pairs start with ``first`` and sample with ``stream_params``;
        ``on_stream`` takes each engine step's pieces and returns the nodes or streamed requests to
        start and the tags to stop."""

        def tokens(
            pieces: list[tuple[Any, Generation]],
        ) -> tuple[list[tuple[Any, GenerationRequest]], list[Any]]:
            started, stopped = on_stream(pieces)
            return [self.pair(n) if isinstance(n, Node) else n for n in started], stopped

        require_power(self.engine, "streaming", "a streamed tree rollout")
        pairs = [*streamed, *(self.pair(n) for n in first)]
        with self._released():
            self.engine.generate_streaming(
                pairs,
                self.params,
                stream_params,
                self.generator,
                self._done(on_node),
                tokens,
                self.reuse_kv_cache,
            )
        return 1

    def _done(self, on_node: OnNode) -> OnDone[tuple[int, int]]:
        """The engine's callback: a finished request's node takes its tokens and KV, and ``on_node``
        gives the nodes to start next; closed prompts let go of their KV."""

        def done(tag: Any, _: GenerationRequest, out: Generation) -> list[tuple[Any, GenerationRequest]]:
            node = self.trees[tag[0]].nodes[tag[1]]
            node.out, node.kv = out, out.cache
            out.cache = None  # the node holds it, for its children only
            following = [self.pair(n) for n in on_node(node)]
            self._release_closed()
            return following

        return done

    @contextmanager
    def _released(self) -> Iterator[None]:
        """Every node's KV let go when the engine call ends, whether it returns or raises."""
        try:
            yield
        finally:
            self._closing.clear()
            for tree in self.trees:
                tree.release(self.engine)

    def pair(self, node: Node) -> tuple[tuple[int, int], GenerationRequest]:
        """``node``'s request with its tag, (prompt, index)."""
        return (node.prompt, node.index), self.request(node)

    def close(self, prompt: int) -> None:
        """No node of prompt ``prompt`` needs its KV for a child beyond those the current callback
        returns: every node's KV is let go once those children have their requests (on vllm, once the
        engine has admitted them). A node given a child later (TreePO's fallback regrowing from an
        earlier segment) is still sampled: its child computes its context's uncached tail again."""
        self._closing.add(prompt)

    def _release_closed(self) -> None:
        for prompt in self._closing:
            self.trees[prompt].release(self.engine)
        self._closing.clear()

    def held(self) -> int:
        """Nodes whose KV is still held (0 after ``run``)."""
        return sum(node.kv is not None for tree in self.trees for node in tree.nodes.values())
