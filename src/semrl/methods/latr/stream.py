"""LATR's rows on the vllm engine as streamed requests (``latr.vllm_lookahead=stream``;
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
not depend on scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from semrl.errors import EngineError
from semrl.methods.latr.tree import Branch, ForestSettings, LatrForest
from semrl.rollout.engines import Generation, GenerationRequest, SamplingParams, node_seed

if TYPE_CHECKING:
    from semrl.methods.interface import RolloutContext

# ("look", stream, 0) for a lookahead row's request, ("row", prompt, row) for a sampled row
Tag = tuple[str, int, int]


def group_rows(tree: list[Branch], width: int, group_size: int) -> list[Branch | None]:
    """A prompt's n rows: its tree rows, pads up to ``width`` (copies of the main row, sampled on from
    its lookahead), then ``None`` for each ordinary row."""
    pads = [tree[0]] * (width - len(tree)) if tree else []
    return [*tree, *pads, *[None] * (group_size - width)]


@dataclass
class _Stream:
    """One lookahead row's request: the response position of its first token, and the (top-2 ids,
    top-2 log-probs) it returned for each position since, the sampled token first."""

    branch: Branch
    start: int
    tops: list[tuple[tuple[int, int], tuple[float, float]]] = field(default_factory=list)


class StreamedRows:
    """The forest and the sampled rows of one LATR rollout on the vllm engine; ``run`` drives them.

    Attributes:
        forest: the lookahead's trees, as ``lookahead_phase`` leaves them.
        steps: loop steps the lookahead ran.
        outs: (prompt, row) -> the sampled continuation of every row that had one.
        streams: the lookahead rows' requests, each with the top-2 it returned, in order of creation.
    """

    def __init__(
        self,
        ctx: RolloutContext,
        prompt_ids: list[list[int]],
        settings: ForestSettings,
        limit: int,
        seeds: list[int],
    ) -> None:
        assert ctx.decode is not None, "LATR's rollout needs RolloutContext.decode (keep_math_symbols)"
        self.ctx, self.prompt_ids, self.limit, self.seeds = ctx, prompt_ids, limit, seeds
        eos = frozenset(int(t) for t in ctx.engine.eos_token_ids)
        self.forest = LatrForest(len(prompt_ids), settings, eos, ctx.decode)
        self.steps = 0
        self.outs: dict[tuple[int, int], Generation] = {}
        self.streams: list[_Stream] = []
        self._stream_of: dict[int, int] = {}  # id(branch) -> its stream
        self._done = settings.width == 0

    def run(self) -> None:
        """Sample every row: the lookahead streams and ordinary rows first, the kept rows when the
        lookahead ends."""
        width, n = self.forest.settings.width, self.ctx.group_size
        requests: list[tuple[Tag, GenerationRequest]] = []
        if width:
            for tree in self.forest.trees:
                requests += self._stream(tree[0])
        for p, prompt in enumerate(self.prompt_ids):
            for j in range(width, n):
                requests.append((("row", p, j), GenerationRequest(prompt, seed=node_seed(self.seeds[p], j))))
        greedy = SamplingParams(temperature=0.0, max_new_tokens=self.limit, logprobs_top_k=2)
        engine = self.ctx.engine
        stream = getattr(engine, "generate_streaming", None)
        if stream is None:
            raise EngineError(f"latr.vllm_lookahead=stream needs the vllm engine, not {engine.name}")
        stream(requests, self.ctx.params, greedy, self.ctx.generator, self._on_done, self._on_tokens)
        if not self._done:
            raise EngineError(
                f"LATR's streamed lookahead stopped at loop step {self.steps}: the engine ended a row's "
                "request before the forest had its tokens; report this with the vLLM version"
            )

    def _stream(self, branch: Branch) -> list[tuple[Tag, GenerationRequest]]:
        """The request that grows ``branch`` greedily from its tokens; none for a row that has ended or
        reached the token limit (the forest never asks for its next token)."""
        key = len(self.streams)
        self.streams.append(_Stream(branch, len(branch.tokens)))
        self._stream_of[id(branch)] = key
        budget = self.limit - len(branch.tokens)
        if branch.finished or budget < 1:
            return []
        prompt = self.prompt_ids[branch.root]
        return [(("look", key, 0), GenerationRequest(prompt, list(branch.tokens), budget, stream=True))]

    def _on_done(
        self, tag: Tag, request: GenerationRequest, generation: Generation
    ) -> list[tuple[Tag, GenerationRequest]]:
        self.outs[tag[1:]] = generation
        return []

    def _on_tokens(
        self, pieces: list[tuple[Tag, Generation]]
    ) -> tuple[list[tuple[Tag, GenerationRequest]], list[Tag]]:
        for tag, piece in pieces:
            stream = self.streams[tag[1]]
            ids, logprobs = piece.token_ids.tolist(), piece.logprobs.tolist()
            top_ids, top_logprobs = piece.top_ids.tolist(), piece.top_logprobs.tolist()
            for token, logprob, ranked, ranked_logprobs in zip(
                ids, logprobs, top_ids, top_logprobs, strict=True
            ):
                # the row goes on with the token the engine took; its rival is the best other one
                other = 1 if ranked[0] == token else 0
                stream.tops.append(((token, ranked[other]), (logprob, ranked_logprobs[other])))
        return self._advance()

    def _advance(self) -> tuple[list[tuple[Tag, GenerationRequest]], list[Tag]]:
        """Run every loop step whose tokens have all come; returns the forks' requests and the
        pruned rows' (at the phase's end: the kept rows' finishing requests, and every stream)."""
        forest = self.forest
        started: list[tuple[Tag, GenerationRequest]] = []
        stopped: list[Tag] = []
        while not self._done:
            step, rows = self.steps, forest.active()
            tops = []
            for row in rows:
                stream = self.streams[self._stream_of[id(row)]]
                if step - stream.start >= len(stream.tops):
                    return started, stopped  # this row's token has not come yet
                tops.append(stream.tops[step - stream.start])
            before = {id(b) for tree in forest.trees for b in tree}
            forest.advance(step, rows, [t[0] for t in tops], [t[1] for t in tops])
            after = {id(b) for tree in forest.trees for b in tree}
            for branch in (b for tree in forest.trees for b in tree if id(b) not in before):
                started += self._stream(branch)
            stopped += [("look", self._stream_of[i], 0) for i in before - after]
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

    def _finishing(self) -> list[tuple[Tag, GenerationRequest]]:
        """Every tree row and pad that has not ended, sampled on from its lookahead tokens."""
        width, n, budget = self.forest.settings.width, self.ctx.group_size, self.ctx.params.max_new_tokens
        requests: list[tuple[Tag, GenerationRequest]] = []
        for p, tree in enumerate(self.forest.trees):
            for j, branch in enumerate(group_rows(tree, width, n)[:width]):
                if branch is None or branch.finished or len(branch.tokens) >= budget:
                    continue
                request = GenerationRequest(
                    self.prompt_ids[p],
                    list(branch.tokens),
                    budget - len(branch.tokens),
                    seed=node_seed(self.seeds[p], j),
                )
                requests.append((("row", p, j), request))
        return requests
