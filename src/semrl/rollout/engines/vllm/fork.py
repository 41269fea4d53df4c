"""A child request that continues its parent's KV inside vLLM, partial block included (the vllm
engine's fork power; docs/engines.md, "Forks on vllm").

vLLM's prefix cache serves whole KV blocks only, so a child whose context has L tokens recomputes
``((L - 1) mod B) + 1`` of them (B: the block size). vLLM 0.32 has a copy-on-write path for a cache
hit that ends inside a block (``SingleTypeKVCacheManager._has_partial_local_hit``, built for hybrid
models): the request gets a private copy of the partial block, and only the tokens after the hit are
computed. Two hooks on the in-process engine core's ``KVCacheManager`` reach it:

* ``free``: a request marked as a parent takes one more reference on its blocks before they are
  freed (``BlockPool.touch``), and they are held with its computed tokens until released;
* ``get_computed_blocks``: a request marked as a fork of a parent (held, or still running) gets the
  parent's blocks up to ``min(parent's computed tokens, L - 1)`` and that count, after a check that
  its context begins with exactly those tokens. vLLM then copies the partial block and computes one
  context token.

The hooks touch private internals, so they are installed only on the vLLM versions they were written
for (``SUPPORTED``) and after a check of what they patch; anywhere else, and for any child whose
parent is gone or differs, the plain prefix-cache path runs: the same tokens, only slower.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

from semrl.rollout.engines.base import GenerationRequest, KVHandle
from semrl.rollout.engines.vllm import state

logger = logging.getLogger(__name__)

SUPPORTED = ("0.32.",)  # vLLM 0.33 changed get_computed_blocks(request, max_cache_hit_length=None)
# holds take at most this share of the KV cache's blocks: the rest stays for running requests, so that
# held parents never starve their own children (a parent finishing past it is not held)
HELD_SHARE = 0.5


def say_once(key: str, message: str, *args: object) -> None:
    """Log the fork's notice ``key`` as a warning, the first time in this process only."""
    if key not in state.NOTICES_SAID:
        state.NOTICES_SAID.add(key)
        logger.warning(message, *args)


def external_id(request_id: str) -> str:
    """The id semrl gave a request: vLLM appends ``-`` and 8 characters to it (``input_processor``)."""
    return request_id.rsplit("-", 1)[0]


def unsupported(vllm_version: str, manager: Any) -> str | None:
    """Why the hooks cannot be installed on this vLLM and this KV cache manager, or None."""
    if not vllm_version.startswith(SUPPORTED):
        return f"vLLM {vllm_version} is not a version the fork was written for ({', '.join(SUPPORTED)}x)"
    for name in ("get_computed_blocks", "free"):
        params = list(inspect.signature(getattr(type(manager), name)).parameters)
        if params != ["self", "request"]:
            return f"KVCacheManager.{name}{tuple(params)} is not the (self, request) it was written for"
    managers: Any = getattr(getattr(manager, "coordinator", None), "single_type_managers", ())
    if len(managers) != 1:
        return f"{len(managers)} KV cache groups: the fork handles one"
    needed = ("req_to_blocks", "_has_partial_local_hit", "block_size")
    copies = all(hasattr(managers[0], name) for name in needed)
    if not copies or not hasattr(manager, "create_kv_cache_blocks"):
        return "the KV cache manager lacks the copy-on-write path the fork uses"
    return None


@dataclass(frozen=True)
class HeldKV(KVHandle):
    """The vllm engine's ``KVHandle``: a finished request's blocks, held for its children, named by
    its ``request_id``. Let go with ``Engine.release_kv``."""

    request_id: str


@dataclass
class _Held:
    """A finished parent's blocks, one reference taken, and the tokens their KV holds."""

    blocks: list[Any]
    tokens: list[int]


@dataclass
class ForkHooks:
    """The two hooks on one engine core's ``KVCacheManager``, and what they hold.

    Attributes:
        parents: ids of requests whose blocks are held when they finish.
        forks: child id -> the id of the parent whose KV it continues.
        held: parent id -> its held blocks and tokens.
        deferred: parents let go while a child that names them still waits for admission: freed
            after the engine step that admits it (``settle``).
        forked, fallbacks: children that continued a parent's KV / that took the plain path.
        refused: finished parents not held because the holds had reached ``HELD_SHARE`` of the KV
            cache (their children compute their context again).
    """

    manager: Any
    scheduler: Any
    parents: set[str] = field(default_factory=set)
    forks: dict[str, str] = field(default_factory=dict)
    held: dict[str, _Held] = field(default_factory=dict)
    deferred: set[str] = field(default_factory=set)
    forked: int = 0
    fallbacks: int = 0
    refused: int = 0
    _at_call_start: tuple[int, int, int] = (0, 0, 0)

    # ---- the verbs an engine call uses, in the order it uses them

    def start_call(self) -> None:
        """A call begins: its forks, fallbacks and refused holds are counted from here."""
        self._at_call_start = (self.forked, self.fallbacks, self.refused)

    def mark(self, request_id: str, request: GenerationRequest, reuse_kv_cache: bool) -> None:
        """A request about to be added: held when it finishes (``reuse_kv_cache`` and its ``keep_kv``),
        and a fork of the parent its ``cache`` names."""
        if reuse_kv_cache and request.keep_kv:
            self.parents.add(request_id)
        if isinstance(request.cache, HeldKV):
            self.forks[request_id] = request.cache.request_id

    def after_step(self, produced: bool) -> None:
        """After an engine step: free the let-go parents whose children it admitted; when it
        ``produced`` no output, let no hold stall the engine."""
        if self.deferred:
            self.settle()
        if not produced:
            self.starved()

    def handle(self, request_id: str, finished: bool, running_stream: bool) -> HeldKV | None:
        """The KV handle a request's generation carries: a finished request's held blocks, or a
        stream's own while it runs (its children fork it mid-way); None otherwise."""
        if (finished and request_id in self.held) or running_stream:
            return HeldKV(request_id)
        return None

    def end_call(self) -> tuple[int, int, int]:
        """A call ends, returning or raising: every hold and mark let go, and the call's (forked,
        fallbacks, refused holds), said once per process when holds were refused."""
        self.release_all()
        first = self._at_call_start
        spent = (self.forked - first[0], self.fallbacks - first[1], self.refused - first[2])
        self.say_refused(spent[2])
        return spent

    @property
    def _blocks_of(self) -> dict[str, list[Any]]:
        blocks: dict[str, list[Any]] = self.manager.coordinator.single_type_managers[0].req_to_blocks
        return blocks

    def install(self) -> None:
        original_free, original_lookup = self.manager.free, self.manager.get_computed_blocks

        def free(request: Any) -> None:
            rid = external_id(request.request_id)
            blocks = list(self._blocks_of.get(request.request_id, ()))
            if rid in self.parents and request.is_finished():
                self.parents.discard(rid)
                if self._room(blocks):
                    computed = request.num_computed_tokens
                    self.manager.block_pool.touch(blocks)
                    self.held[rid] = _Held(blocks, list(request.all_token_ids[:computed]))
                else:
                    self.refused += 1
            original_free(request)

        def get_computed_blocks(request: Any) -> Any:
            plain = original_lookup(request)
            parent = self.forks.pop(external_id(request.request_id), None)
            if parent is None:
                return plain
            found = self._parent_state(parent)
            if found is None:
                self.fallbacks += 1
                return plain
            blocks, tokens = found
            computed = min(len(tokens), request.num_tokens - 1)
            if list(request.all_token_ids[:computed]) != tokens[:computed]:
                self.fallbacks += 1  # the child does not continue this parent: never serve its KV
                return plain
            if computed <= plain[1]:  # the prefix cache serves as much
                return plain
            size = self.manager.coordinator.single_type_managers[0].block_size
            used = blocks[: -(-computed // size)]
            self.forked += 1
            return self.manager.create_kv_cache_blocks((list(used),)), computed, 0

        self.manager.free, self.manager.get_computed_blocks = free, get_computed_blocks

    def _room(self, blocks: list[Any]) -> bool:
        """Whether holding ``blocks`` too keeps the held blocks within ``HELD_SHARE`` of the KV cache
        (a block shared by several holders, a prompt's, counts once)."""
        held = {id(b) for h in self.held.values() for b in h.blocks} | {id(b) for b in blocks}
        pool: int = self.manager.block_pool.num_gpu_blocks
        return len(held) <= HELD_SHARE * pool

    def starved(self) -> bool:
        """Requests wait, none runs, and holds keep blocks: let go of every hold (their children
        take the plain path) so that the engine can go on."""
        if not self.held or self.scheduler.running or not self.scheduler.waiting:
            return False
        for parent in list(self.held):
            self._free(parent)
        return True

    def _parent_state(self, parent: str) -> tuple[list[Any], list[int]] | None:
        """A held parent's blocks and tokens, or a running one's now; None when it is gone."""
        if parent in self.held:
            return self.held[parent].blocks, self.held[parent].tokens
        for request_id, request in self.scheduler.requests.items():
            if external_id(request_id) == parent and not request.is_finished():
                computed = request.num_computed_tokens
                return list(self._blocks_of.get(request_id, ())), list(request.all_token_ids[:computed])
        return None

    def release(self, parent: str) -> None:
        """Let go of a parent's hold (and of its mark, if it has not finished) after the next engine
        step (``settle``): the children its last callback started are submitted after the callback
        returns, and take its blocks when that step admits them. A parent held by nothing (not
        finished yet, refused, or let go when its call ended) has nothing to free."""
        self.parents.discard(parent)
        if parent in self.held:
            self.deferred.add(parent)

    def settle(self) -> None:
        """After an engine step: free the let-go parents that no child waiting for admission names."""
        for parent in [p for p in self.deferred if p not in self.forks.values()]:
            self.deferred.discard(parent)
            self._free(parent)

    def _free(self, parent: str) -> None:
        held = self.held.pop(parent, None)
        if held is not None:
            self.manager.block_pool.free_blocks(reversed(held.blocks))

    def say_refused(self, refused: int) -> None:
        """Warn once per process that ``refused`` finished requests of a call were not held."""
        if refused:
            say_once(
                "holds refused",
                "rollout.vllm_fork: holds reached %d%% of the KV cache's %d blocks, so %d finished "
                "requests were not held and their children computed their context again "
                "(rollout/holds_refused counts them; raise rollout.vllm_kv_cache_gib, docs/engines.md)",
                round(100 * HELD_SHARE),
                self.manager.block_pool.num_gpu_blocks,
                refused,
            )

    def release_all(self) -> None:
        """Every hold and mark, now: at the end of a call, on errors, before a prefix-cache reset."""
        self.forks.clear()
        self.parents.clear()
        self.deferred.clear()
        for parent in list(self.held):
            self._free(parent)


def install_fork_hooks(llm: Any, vllm_version: str, scheduler: Any) -> tuple[ForkHooks | None, str | None]:
    """The fork hooks of ``llm``'s in-process engine core (installed once per engine), or None and why
    not."""
    manager = getattr(scheduler, "kv_cache_manager", None)
    reason = (
        "the engine core is not in this process" if manager is None else unsupported(vllm_version, manager)
    )
    if reason is not None:
        return None, reason
    hooks = getattr(llm, "_semrl_fork_hooks", None)
    if hooks is not None:
        return hooks, None
    hooks = ForkHooks(manager, scheduler)
    hooks.install()
    llm._semrl_fork_hooks = hooks
    return hooks, None
