"""LATR's rows on the vllm engine as streamed requests (``latr.lookahead_on=stream``;
docs/methods/latr.md, "On the vllm engine").

Each lookahead row is one greedy vLLM request that returns its token and the raw distribution's two
most likely tokens after every engine step (``VLLMEngine.generate_streaming``). A fork is a new
request whose context is the parent's prompt and tokens plus the second token; a pruned row's request
is aborted. The forest (``semrl.methods.latr.tree.LatrForest``) still advances in lockstep: loop step t
runs once every active row's t-th token has come, so its decisions are those of the batched lookahead
on the same top-2, whichever request the engine serves first. A row's greedy tokens do not depend on
the forest, so it samples on while it waits. The n - k ordinary rows run beside the lookahead from the
start, and every kept row is finished in the same running batch as soon as the phase ends: one engine
loop, no request per token and no barrier but the phase's end.

Every sampled row draws from its own seed, ``node_seed(prompt seed, row index)``, so its tokens do
not depend on scheduling. The sampled rows are nodes of the tree-rollout kit (``semrl.rollout.tree_kit``):
a kept row's lookahead tokens are a given node, and its finishing request a child of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from semrl.errors import EngineError
from semrl.methods.latr.tree import Branch, ForestSettings, LatrForest
from semrl.rollout.engines import Generation, GenerationRequest, SamplingParams
from semrl.rollout.tree_kit import Node, TreeSampler, given

if TYPE_CHECKING:
    from semrl.methods.interface import RolloutContext

# ("look", stream, 0) for a lookahead row's request (a sampled row's is its node's (prompt, row))
Tag = tuple[str, int, int]


def group_rows(tree: list[Branch], width: int, group_size: int) -> list[Branch | None]:
    """A prompt's n rows: its tree rows, pads up to ``width`` (copies of the main row, sampled on from
    its lookahead), then ``None`` for each ordinary row."""
    pads = [tree[0]] * (width - len(tree)) if tree else []
    return [*tree, *pads, *[None] * (group_size - width)]


def row_nodes(
    kit: TreeSampler, trees: list[list[Branch]], width: int, group_size: int, top_k: int
) -> list[list[Node | None]]:
    """Per prompt and row, the node of lookahead tokens its finishing request continues (a tree row's
    own; a pad's: the main row's), or None for an ordinary row. Each tree row becomes a given node
    (index ``group_size + b``, never sampled), a child of its parent's at its fork position, holding
    its KV when the lookahead handed one (``Branch.kv``, then the kit's: it lets go of it)."""
    out = []
    for p, tree in enumerate(trees):
        nodes, of = kit.trees[p], dict[int, Node]()
        for b, branch in enumerate(tree):
            parent = of[id(branch.parent)] if branch.parent is not None else None
            start = branch.fork_position if parent is not None else 0
            tokens = given(branch.tokens[start:], branch.logprobs[start:], branch.finished, top_k)
            of[id(branch)] = nodes.add(group_size + b, parent, start, out=tokens, kv=branch.kv)
            branch.kv = None
        out.append(
            [None if branch is None else of[id(branch)] for branch in group_rows(tree, width, group_size)]
        )
    return out


def row_parents(rows: list[Node | None], grown: int, group_size: int) -> list[int]:
    """A prompt's rows' parents in its prefix tree: a tree row's is the row it forked from (even at
    position 0, where they share no token), a pad's the main row, an ordinary row has none."""
    out = []
    for j, base in enumerate(rows):
        if base is None or (j < grown and base.parent is None):
            out.append(-1)
        else:
            out.append(base.parent.index - group_size if j < grown and base.parent is not None else 0)
    return out


def finishing_nodes(
    kit: TreeSampler, bases: list[list[Node | None]], budget: int, ordinary: bool
) -> list[Node]:
    """The requests that sample every row on (node j for row j): a kept row that has not ended nor
    reached ``budget`` continues its lookahead; with ``ordinary``, an ordinary row samples from its
    prompt."""
    out = []
    for p, rows in enumerate(bases):
        for j, base in enumerate(rows):
            if base is None:
                if ordinary:
                    out.append(kit.trees[p].add(j, leaf=True))
            elif not base.response().finished and len(base.response().token_ids) < budget:
                out.append(kit.trees[p].add(j, base, leaf=True))
    return out


class StreamedRows:
    """The forest and the sampled rows of one LATR rollout on the vllm engine; ``run`` drives them.

    Attributes:
        forest: the lookahead's trees, as ``lookahead_phase`` leaves them.
        steps: loop steps the lookahead ran.
        kit: the rows' nodes: node j of prompt p is row j's sampled continuation, if it had one.
        bases: per prompt and row, the node of lookahead tokens it continues (``row_nodes``), once the
            lookahead has ended.
        streams: every lookahead row in the order its request was made (``Branch.stream`` its place),
            each with the top-2 its request returned (``Branch.tops``) and its KV (``Branch.kv``).
    """

    def __init__(
        self,
        ctx: RolloutContext,
        prompt_ids: list[list[int]],
        settings: ForestSettings,
        limit: int,
    ) -> None:
        assert ctx.decode is not None, "LATR's rollout needs RolloutContext.decode (keep_math_symbols)"
        self.ctx, self.prompt_ids, self.limit = ctx, prompt_ids, limit
        eos = frozenset(int(t) for t in ctx.engine.eos_token_ids)
        self.forest = LatrForest(len(prompt_ids), settings, eos, ctx.decode)
        self.steps = 0
        # an engine that forks holds each stream's KV: forks and finishing rows continue it
        self.kit = TreeSampler.from_context(ctx, prompt_ids, reuse_kv_cache=True)
        n = ctx.group_size
        self.bases: list[list[Node | None]] = [[None] * n for _ in prompt_ids]
        self.streams: list[Branch] = []
        self._done = settings.width == 0

    def run(self) -> None:
        """Sample every row: the lookahead streams and ordinary rows first, the kept rows when the
        lookahead ends."""
        width, n = self.forest.settings.width, self.ctx.group_size
        streamed: list[tuple[Tag, GenerationRequest]] = []
        if width:
            for tree in self.forest.trees:
                streamed += self._stream(tree[0])
        # rows that sample to their end are leaves: no KV held for them (only the streams have children)
        ordinary = [tree.add(j, leaf=True) for tree in self.kit.trees for j in range(width, n)]
        greedy = SamplingParams(temperature=0.0, max_new_tokens=self.limit, logprobs_top_k=2)
        self.kit.run_streaming(ordinary, lambda node: [], self._on_tokens, greedy, streamed)
        if not self._done:
            raise EngineError(
                f"LATR's streamed lookahead stopped at loop step {self.steps}: the engine ended a row's "
                "request before the forest had its tokens; report this with the vLLM version"
            )

    @property
    def outs(self) -> dict[tuple[int, int], Generation]:
        """(prompt, row) -> the sampled continuation of every row that had one."""
        n = self.ctx.group_size
        return {
            (tree.prompt, j): node.out
            for tree in self.kit.trees
            for j, node in tree.nodes.items()
            if j < n and node.out is not None
        }

    def _stream(self, branch: Branch) -> list[tuple[Tag, GenerationRequest]]:
        """The request that grows ``branch`` greedily from its tokens; none for a row that has ended or
        reached the token limit (the forest never asks for its next token)."""
        branch.stream, branch.stream_start = len(self.streams), len(branch.tokens)
        self.streams.append(branch)
        budget = self.limit - len(branch.tokens)
        if branch.finished or budget < 1:
            return []
        prompt = self.prompt_ids[branch.root]
        parent = branch.parent.kv if branch.parent is not None else None
        request = GenerationRequest(prompt, list(branch.tokens), budget, cache=parent, stream=True)
        return [(("look", branch.stream, 0), request)]

    def _on_tokens(self, pieces: list[tuple[Tag, Generation]]) -> tuple[list[Any], list[Tag]]:
        for tag, piece in pieces:
            stream = self.streams[tag[1]]
            stream.kv = piece.cache if piece.cache is not None else stream.kv
            ids, logprobs = piece.token_ids.tolist(), piece.logprobs.tolist()
            top_ids, top_logprobs = piece.top_ids.tolist(), piece.top_logprobs.tolist()
            for token, logprob, ranked, ranked_logprobs in zip(
                ids, logprobs, top_ids, top_logprobs, strict=True
            ):
                # the row goes on with the token the engine took; its rival is the best other one
                other = 1 if ranked[0] == token else 0
                stream.tops.append(((token, ranked[other]), (logprob, ranked_logprobs[other])))
        return self._advance()

    def _advance(self) -> tuple[list[Any], list[Tag]]:
        """Run every loop step whose tokens have all come; returns the forks' requests and the
        pruned rows' (at the phase's end: the kept rows' finishing nodes, and every stream)."""
        forest = self.forest
        started: list[Any] = []
        stopped: list[Tag] = []
        while not self._done:
            step, rows = self.steps, forest.active()
            tops = []
            for row in rows:
                if step - row.stream_start >= len(row.tops):
                    return started, stopped  # this row's token has not come yet
                tops.append(row.tops[step - row.stream_start])
            before = [b for tree in forest.trees for b in tree]
            forest.advance(step, rows, [t[0] for t in tops], [t[1] for t in tops])
            after = {b for tree in forest.trees for b in tree}
            for branch in (b for tree in forest.trees for b in tree if b.stream < 0):
                started += self._stream(branch)
            for pruned in (b for b in before if b not in after):  # its KV serves no row any more
                stopped.append(("look", pruned.stream, 0))
                if pruned.kv is not None:
                    self.ctx.engine.release_kv(pruned.kv)
            self.steps = step + 1
            if (
                not forest.active()
                or forest.full(step, self.ctx.params.max_new_tokens)
                or self.steps >= self.limit
            ):
                self._done = True
                stopped = [("look", key, 0) for key in range(len(self.streams))]
                started = self._finishing()
        return started, stopped

    def _finishing(self) -> list[Node]:
        """Every tree row and pad that has not ended, sampled on from its lookahead tokens."""
        width, n, params = self.forest.settings.width, self.ctx.group_size, self.ctx.params
        self.bases = row_nodes(self.kit, self.forest.trees, width, n, params.logprobs_top_k)
        return finishing_nodes(self.kit, self.bases, params.max_new_tokens, ordinary=False)
