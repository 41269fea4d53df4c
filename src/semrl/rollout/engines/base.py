"""What every sampling engine shares: the request and result types and the ``Engine`` interface
(docs/engines.md).

Two engines implement ``Engine``: ``hf`` (``semrl.rollout.engines.hf.HFEngine``, semrl's batched
transformers sampler, the reference) and ``vllm`` (``semrl.rollout.engines.vllm.VLLMEngine``, vLLM in
the training process). The trainer, ROSE, FR3E, evaluation and curriculum scoring only call this
interface, so they run unchanged on either engine; ``semrl.rollout.engines.build_engine`` makes one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch

from semrl.errors import EngineError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from semrl.config.sections import RolloutConfig


@dataclass
class EngineCost:
    """What sampling cost an engine, counted since it started (``Engine.cost``); the difference of
    two snapshots is a rollout's cost, logged every step (docs/engines.md, "What a rollout costs").

    Attributes:
        sampled_tokens: new tokens sampled; a prefix handed in as context is not counted.
        prefill_tokens: context tokens the engine computed before sampling (prompt + prefix, less what
            a cache served: vllm's ``num_cached_tokens``, hf's ``PrefixCache``). A tree branch whose
            parent's KV is cached computes only the context's uncached tail: with vllm's prefix cache,
            ``((L - 1) mod B) + 1`` tokens of a context of L tokens (B = the block size).
        engine_steps: forward passes of the engine (a prefill, a decode step, or a mix on vllm).
        running_rows: sequences in each forward, summed over forwards (over ``engine_steps``: the mean
            running batch).
        requests: sequences requested.
        forked_requests: children that continued their parent's KV inside the engine (vllm's fork).
        fork_fallbacks: children that asked to and took the plain prefix-cache path (parent gone,
            context differing, or a vLLM the fork was not written for).
        holds_refused: finished requests whose KV was not held for their children because the holds
            had reached half the KV cache (vllm's fork; raise ``rollout.vllm_kv_cache_gib``).
        sampling_s: wall seconds inside the engine's sampling (``sampling_time``: hf's batched
            generation, vllm's engine loop with the callbacks it calls, the row loop's forwards); the
            rest of a rollout is the method's own work around it (``time/rollout/around_s``).
    """

    sampled_tokens: int = 0
    prefill_tokens: int = 0
    engine_steps: int = 0
    running_rows: int = 0
    requests: int = 0
    forked_requests: int = 0
    fork_fallbacks: int = 0
    holds_refused: int = 0
    sampling_s: float = 0.0

    def snapshot(self) -> EngineCost:
        return EngineCost(**vars(self))

    def since(self, before: EngineCost) -> EngineCost:
        """The cost incurred after ``before`` (an earlier snapshot)."""
        return EngineCost(**{k: v - getattr(before, k) for k, v in vars(self).items()})

    @property
    def mean_running_batch(self) -> float:
        return self.running_rows / self.engine_steps if self.engine_steps else 0.0


@contextmanager
def sampling_time(cost: EngineCost) -> Iterator[None]:
    """Add the block's wall seconds to ``cost.sampling_s`` (an engine's sampling loop)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        cost.sampling_s += time.perf_counter() - start


@dataclass(frozen=True)
class RequestRecord:
    """One request as an engine served it (``Engine.request_log``): when it entered and left, counted
    in the engine's forward passes (``EngineCost.engine_steps``), and what it cost.

    Attributes:
        tag: the caller's tag (``generate_dynamic``) or the request's index (``generate``).
        context_tokens: prompt + prefix tokens.
        prefill_tokens: of those, the ones the engine computed (the rest came from a cache).
        sampled_tokens: new tokens.
        submitted_step, finished_step: the engine's step count when it was added and when it came back.
    """

    tag: Any
    context_tokens: int
    prefill_tokens: int
    sampled_tokens: int
    submitted_step: int
    finished_step: int


class KVHandle:
    """A finished request's KV, kept by the engine that sampled it for the requests that continue it
    (``Generation.cache``, handed on as ``GenerationRequest.cache``; ``EnginePowers.fork``). Opaque:
    only the engine that made it opens it (hf: the KV rows themselves,
    ``semrl.rollout.engines.kv_cache.PrefixCache``; vllm: the blocks it holds,
    ``semrl.rollout.engines.vllm.fork.HeldKV``). Let go with ``Engine.release_kv``."""

    __slots__ = ()


@dataclass(frozen=True)
class SamplingParams:
    """How an engine samples: temperature, top-p, top-k (0: off), the response budget and how many of the
    largest log-probs of every position it returns (0: the sampled token's only)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    logprobs_top_k: int = 20


def sampling_params(
    rollout: RolloutConfig, temperature: float | None = None, *, top_logprobs: bool
) -> SamplingParams:
    """The sampler of the ``rollout`` config section; ``temperature`` replaces its temperature
    (evaluation's ``logging.eval_temperature``). ``top_logprobs``: whether the caller reads the
    ``rollout.logprobs_top_k`` largest log-probs of every position (ROSE's branching does); without
    them an engine returns the sampled token's log-prob only (k = 0), which is cheaper."""
    return SamplingParams(
        temperature=rollout.temperature if temperature is None else temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=rollout.max_new_tokens,
        logprobs_top_k=rollout.logprobs_top_k if top_logprobs else 0,
    )


@dataclass
class GenerationRequest:
    """One continuation to sample: the prompt, tokens already chosen after it (a tree branch's prefix),
    its own budget, the KV cache of a leading part, and its own seed."""

    prompt_ids: list[int]
    prefix_ids: list[int] = field(default_factory=list)
    max_new_tokens: int | None = None  # overrides SamplingParams.max_new_tokens (branch budgets)
    # KV of a leading part of prompt_ids + prefix_ids: hf's own copy, or a request's KV the engine holds
    cache: KVHandle | None = None
    # Own random stream: the sample then does not depend on the other rows of its batch, the
    # generation batch size or the number of processes (rollout.seed_per_sequence).
    seed: int | None = None
    # Hand every new token to the caller as it is sampled, with the stream's own sampler
    # (``VLLMEngine.generate_streaming``; LATR's lookahead rows). Other calls refuse it.
    stream: bool = False
    # With ``reuse_kv_cache``: False when the caller gives it no child, so that the engine keeps no KV for
    # it (vllm holds none of its blocks, hf makes no copy): its result's cache is None.
    keep_kv: bool = True
    # The caller reads its entropy during the rollout (``Generation.entropy``): an engine that computes
    # none for every request (vllm) records it while sampling where it can; hf always does.
    entropy: bool = False


@dataclass
class Generation:
    """One sampled continuation; tensors have length L = number of new tokens.

    Attributes:
        token_ids: (L,) new tokens, including the final EOS if there is one.
        logprobs: (L,) log-prob of each sampled token.
        top_logprobs: (L, k) largest log-probs at each position, descending.
        top_ids: (L, k) their token ids.
        entropy: (L,) entropy of the full next-token distribution; None from an engine that does
            not compute it (vllm): ``semrl.update.row_logprobs.with_sampling_entropy`` returns it with one.
        finished: ended with EOS.
        cache: with ``reuse_kv_cache``, on an engine that forks: KV of context + token_ids[:-1] (every
            token fed to the model), a copy (hf) or held in the engine (vllm).
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    top_logprobs: torch.Tensor
    top_ids: torch.Tensor
    entropy: torch.Tensor | None
    finished: bool
    cache: KVHandle | None = None

    @property
    def truncated(self) -> bool:
        return not self.finished


def join_generations(parts: list[Generation]) -> Generation:
    """Consecutive pieces of one response (a tree path's segments, a prefix and its continuation)
    as one ``Generation``; its entropy only when every piece has one, its end the last piece's."""
    pieces = [part.entropy for part in parts if part.entropy is not None]
    entropy = torch.cat(pieces) if len(pieces) == len(parts) else None
    return Generation(
        token_ids=torch.cat([part.token_ids for part in parts]),
        logprobs=torch.cat([part.logprobs for part in parts]),
        top_logprobs=torch.cat([part.top_logprobs for part in parts]),
        top_ids=torch.cat([part.top_ids for part in parts]),
        entropy=entropy,
        finished=parts[-1].finished,
    )


def request_budget(request: GenerationRequest, params: SamplingParams, streaming: bool = False) -> int:
    """The request's token budget, after checking that it has a context and a budget >= 1, and that it
    asks for a stream only of a call that streams (``streaming``)."""
    if not request.prompt_ids and not request.prefix_ids:
        raise ValueError("a generation request has an empty prompt")
    if request.stream and not streaming:
        raise ValueError(
            "a generation request asks to stream its tokens (GenerationRequest.stream) in a call that "
            "does not stream; use Engine.generate_streaming"
        )
    budget = request.max_new_tokens if request.max_new_tokens is not None else params.max_new_tokens
    if budget < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {budget}")
    return budget


@dataclass(frozen=True)
class EnginePowers:
    """What an engine can do beyond ``generate`` and ``generate_dynamic`` (docs/engines.md, "What
    each engine can do"). A method asks for a power through these, never by the engine's name; an
    engine that lacks one raises ``EngineError`` naming it (``require_power``).

    Attributes:
        fork: a request may continue the KV of the request it branches from
            (``GenerationRequest.cache``, handed back with ``reuse_kv_cache``), so that only the context's
            uncached tail is computed. hf: the parent's KV rows duplicated. vllm: the parent's blocks
            held in vLLM, the partial one copied (``rollout.vllm_fork``, vLLM 0.32).
        streaming: ``generate_streaming``: greedy requests that hand over their tokens after every
            engine step, beside sampled ones (LATR's lookahead as requests).
        row_loop: ``row_loop()``: rows that take one token per forward of one batched KV cache on the
            sampling model (LATR's lookahead on the model); not on a sharded model.
        continuous_batching: ``generate_dynamic`` starts a request as soon as a slot frees (vllm)
            rather than in rounds of whole batches (hf); evaluation then hands it every request at once.
        computes_entropy: ``Generation.entropy`` is filled at sampling time for every request (hf).
        records_entropy: the entropy of a request that asks (``GenerationRequest.entropy``) is
            recorded while it is sampled, where it can be (vllm with ``rollout.vllm_sampler_entropy``:
            not for greedy requests, nor a record with a position lost). Otherwise, and where a record
            is missing, the trainer measures it with its own forward
            (``semrl.update.row_logprobs.with_sampling_entropy``; a method's rollout through
            ``RolloutContext.sampling_entropy``).
        kv_block_size: the tokens of one unit of its KV cache: a context reused from an earlier
            request is served in whole units, and the rest recomputed. hf: 1 (its caches hold every
            token); vllm: ``rollout.vllm_block_size`` (TreePO's ``segment_alignment=block`` reads it).
    """

    fork: bool = False
    streaming: bool = False
    row_loop: bool = False
    continuous_batching: bool = False
    computes_entropy: bool = False
    records_entropy: bool = False
    kv_block_size: int = 1


POWERS = {
    "fork": "continue a request from its parent's KV",
    "streaming": "stream greedy requests' tokens (generate_streaming)",
    "row_loop": "run lookahead rows on its model (row_loop)",
    "continuous_batching": "start a request as soon as a slot frees",
    "computes_entropy": "give every request's entropy as it samples",
    "records_entropy": "record the entropy of the requests that ask as it samples",
}


def require_power(engine: Any, power: str, user: str, setting: str | None = None) -> None:
    """Refuse, naming the engine and what to change, when ``engine`` lacks ``power`` (a field of
    ``EnginePowers``) that ``user`` (a method, a call) needs; ``setting``: the option that asks for it."""
    if getattr(engine.powers, power):
        return
    fix = f"change {setting}, or " if setting else ""
    raise EngineError(
        f"{user} needs an engine that can {POWERS[power]}, which the {engine.name} engine here cannot "
        f"(EnginePowers.{power}); {fix}choose another rollout.engine "
        '(docs/engines.md, "What each engine can do")'
    )


class LookaheadRows(Protocol):
    """Rows that take one token per forward through one batched KV cache, where a row can be copied (a
    fork shares its parent's KV) or dropped between forwards (``Engine.row_loop``; LATR's lookahead).

    ``start`` -> (``top2`` -> ``select`` -> ``feed``)*; ``row_cache`` hands a row's KV to a request.
    """

    def start(self, contexts: list[list[int]]) -> None: ...

    def top2(self) -> tuple[list[tuple[int, int]], list[tuple[float, float]]]: ...

    def select(self, rows: list[int]) -> None: ...

    def feed(self, tokens: list[int]) -> None: ...

    def row_cache(self, row: int) -> KVHandle | None:
        """A row's KV in the form its engine continues, or None where the engine keeps its own."""
        ...


Tag = TypeVar("Tag")
# (tag, request, its generation) -> the requests to start next, each with its tag
OnDone = Callable[[Tag, GenerationRequest, Generation], list[tuple[Tag, GenerationRequest]]]
# one engine step's new tokens of every streamed request, as (tag, piece) ->
# (the requests to start next, each with its tag; the tags of streamed requests to stop now)
OnTokens = Callable[[list[tuple[Tag, Generation]]], tuple[list[tuple[Tag, GenerationRequest]], list[Tag]]]


class Engine(Protocol):
    """What every sampling engine offers.

    Attributes:
        name: ``hf`` or ``vllm``.
        batch_size: sequences generated together (evaluation sizes its chunks by it).
        compute_dtype: the dtype sampling computes in (the training model may hold float32
            master weights).
        eos_token_ids: the ids that end a response (a list or a 1-D tensor).
        generated_tokens: new tokens sampled since the engine started, every call counted; a
            prefix given as ``prompt_ids`` or ``prefix_ids`` is not (tree branches share it). The
            trainer logs the difference over a step's rollout as ``rollout/sampled_tokens``.
        cost: what sampling has cost since the engine started (``EngineCost``: sampled and
            prefill tokens, forward passes, running batch); ``generated_tokens`` is its
            ``sampled_tokens``.
        request_log: None, or a list the engine appends a ``RequestRecord`` to for every request
            it serves (set it to ``[]`` to watch scheduling and per-request cost).
        sampled_by_prompt: None, or a ``Counter`` to which every sampled token is added under its
            request's prompt (``tuple(prompt_ids)``), LATR's lookahead rows included: what each
            prompt of a batched call cost (``semrl explore`` rolls out many problems per call).
        powers: what it can do beyond ``generate`` and ``generate_dynamic`` (``EnginePowers``).
    """

    name: str
    batch_size: int
    compute_dtype: torch.dtype
    eos_token_ids: Any
    cost: EngineCost
    request_log: list[RequestRecord] | None
    sampled_by_prompt: Counter[tuple[int, ...]] | None
    powers: EnginePowers

    @property
    def generated_tokens(self) -> int: ...

    def generate(
        self,
        requests: list[GenerationRequest],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        reuse_kv_cache: bool = False,
        on_finished: Callable[[int], Any] | None = None,
    ) -> list[Generation]:
        """One ``Generation`` per request, in request order. ``on_finished(n)``: n more requests have
        finished, called as they finish (a progress bar's count), before the results return."""
        ...

    def generate_dynamic(
        self,
        requests: list[tuple[Tag, GenerationRequest]],
        params: SamplingParams,
        generator: torch.Generator | None,
        on_done: OnDone[Tag],
        reuse_kv_cache: bool = False,
    ) -> int:
        """Sample tagged requests; each finished one goes to ``on_done(tag, request, generation)``,
        which returns requests to start next (tree rollouts: a prompt's next branch). Returns the
        number of batched generation calls (1 for an engine that adds requests to its running batch)."""
        ...

    def generate_streaming(
        self,
        requests: list[tuple[Tag, GenerationRequest]],
        params: SamplingParams,
        stream_params: SamplingParams,
        generator: torch.Generator | None,
        on_done: OnDone[Tag],
        on_tokens: OnTokens[Tag],
        reuse_kv_cache: bool = False,
    ) -> None:
        """``generate_dynamic`` with streamed requests (``GenerationRequest.stream``) beside the others,
        in one running batch (``EnginePowers.streaming``). A streamed request samples with
        ``stream_params`` and hands its new tokens to ``on_tokens`` after every engine step, for all such
        requests at once; what ``on_tokens`` returns starts at once, and the streamed requests it names
        stop. ``reuse_kv_cache``: as ``generate_dynamic``'s; a stream's pieces carry its KV handle
        too. An engine without the power raises ``EngineError``."""
        ...

    def row_loop(self) -> LookaheadRows:
        """Lookahead rows on the sampling model (``EnginePowers.row_loop``), counted in ``cost``; an
        engine without the power raises ``EngineError``."""
        ...

    def release_kv(self, kv: KVHandle) -> None:
        """Let go of a KV handed back with ``reuse_kv_cache`` (a held one's blocks return to the engine)."""
        ...

    def input_embeddings(self) -> torch.Tensor:
        """(V, D) input embeddings of the weights the engine samples from (ROSE's divergence)."""
        ...

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Make the engine sample from new weights: ``weights``, a stream of (name, full tensor)
        consumed one at a time (under FSDP, ``semrl.core.distributed.iter_full_parameters`` gathers each
        when its turn comes) or, when None, the current weights of the model it was built with.
        Cached prefixes are dropped."""
        ...

    def release_memory(self) -> None:
        """The rollout is over: free what sampling holds (vllm's sleep mode on CUDA: KV cache, and
        weights that the next ``sync_weights`` pushes anyway) until the next ``sync_weights``."""
        ...


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the generation config's EOS ids
    (chat models often name their end-of-turn token only in the generation config)."""
    ids = [tokenizer.eos_token_id]
    configured = model.generation_config.eos_token_id
    ids += configured if isinstance(configured, list) else [configured] if configured is not None else []
    return sorted({int(i) for i in ids if i is not None})
