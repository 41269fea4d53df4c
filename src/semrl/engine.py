"""The sampling-engine interface, and the one place engines are built (docs/engines.md).

Two engines implement :class:`Engine`: ``hf`` (``semrl.rollout.RolloutEngine``, semrl's batched
transformers sampler, the reference) and ``vllm`` (``semrl.vllm_engine.VLLMEngine``, vLLM in the
training process). The trainer, ROSE, FR3E, evaluation and curriculum scoring only call this
interface, so they run unchanged on either engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from semrl.forward import make_sequence_batch, response_logprobs
from semrl.precision import autocast_to
from semrl.rollout import Generation, GenerationRequest, RolloutEngine, SamplingParams


class Engine(Protocol):
    """What every sampling engine offers.

    Attributes:
        name: ``hf`` or ``vllm``.
        batch_size: sequences generated together (evaluation sizes its chunks by it).
        computes_entropy: whether ``Generation.entropy`` is filled at sampling time; when it is
            not, consumers get full-vocabulary entropies from :func:`fill_entropy`.
        model: the Hugging Face model whose weights the engine samples from (it also computes
            the entropies and holds the input embeddings ROSE reads).
        compute_dtype: the dtype sampling computes in (``model.dtype``; ``model`` may hold
            float32 master weights).
    """

    name: str
    batch_size: int
    computes_entropy: bool
    model: PreTrainedModel
    compute_dtype: torch.dtype

    def generate(
        self,
        requests: list[GenerationRequest],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        return_cache: bool = False,
    ) -> list[Generation]:
        """One ``Generation`` per request, in request order."""
        ...

    def input_embeddings(self) -> torch.Tensor:
        """(V, D) input embeddings of the weights the engine samples from (ROSE's divergence)."""
        ...

    def sync_weights(self, state: dict[str, torch.Tensor] | None = None) -> None:
        """Make the engine sample from new weights: ``state`` (full tensors, e.g. gathered from
        FSDP shards) or, when None, the current weights of ``model``. Cached prefixes are dropped."""
        ...


Tag = TypeVar("Tag")
OnDone = Callable[[Tag, GenerationRequest, Generation], list[tuple[Tag, GenerationRequest]]]


def generate_dynamic(
    engine: Engine,
    requests: list[tuple[Tag, GenerationRequest]],
    params: SamplingParams,
    generator: torch.Generator | None,
    on_done: OnDone,
    return_cache: bool = False,
) -> int:
    """Sample tagged requests; each finished one goes to ``on_done(tag, request, generation)``, which returns
    requests to start next (tree rollouts: a prompt's next branch). An engine with its own
    ``generate_dynamic`` (vllm) starts them at once inside the running batch; otherwise they run in
    rounds of one batched ``generate`` call, finished results handled in request order. Returns the
    number of batched calls."""
    own = getattr(engine, "generate_dynamic", None)
    if own is not None:
        own(requests, params, generator, on_done)
        return 1
    calls = 0
    while requests:
        outputs = engine.generate([r for _, r in requests], params, generator, return_cache)
        calls += 1
        following: list[tuple[Tag, GenerationRequest]] = []
        for (tag, request), out in zip(requests, outputs, strict=True):
            following += on_done(tag, request, out)
        requests = following
    return calls


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the generation config's EOS ids
    (chat models often name their end-of-turn token only in the generation config)."""
    ids = [tokenizer.eos_token_id]
    configured = model.generation_config.eos_token_id
    ids += configured if isinstance(configured, list) else [configured] if configured is not None else []
    return sorted({int(i) for i in ids if i is not None})


def build_engine(
    kind: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    max_model_len: int,
    logprobs_top_k: int = 20,
    seed: int = 0,
    vllm_options: Any = None,
    compute_dtype: torch.dtype | None = None,
) -> Engine:
    """The engine named ``kind`` sampling from ``model``.

    Args:
        max_model_len: longest prompt + response any request will have (vllm sizes its cache by it).
        vllm_options: the ``rollout`` config section (``vllm_*`` keys), or None for the defaults.
        compute_dtype: the dtype sampling computes in (``model.dtype``): vllm holds its weights in
            it; hf autocasts to it when ``model`` holds wider (float32 master) weights. None: the
            model's own dtype.
    """
    eos = eos_token_ids(tokenizer, model)
    if kind == "hf":
        return RolloutEngine(model, eos, tokenizer.pad_token_id, batch_size, compute_dtype)
    if kind == "vllm":
        from semrl.vllm_engine import VLLMEngine, VLLMSettings

        dtype = None if compute_dtype is None else str(compute_dtype).removeprefix("torch.")
        settings = VLLMSettings.from_options(vllm_options, max_model_len, batch_size, logprobs_top_k, seed, dtype)
        return VLLMEngine(model, eos, settings)
    raise ValueError(f"unknown engine '{kind}'; rollout.engine is 'hf' or 'vllm'")


@torch.no_grad()
def fill_entropy(
    model: PreTrainedModel,
    contexts: list[list[int]],
    generations: list[Generation],
    temperature: float,
    micro_batch_size: int = 8,
    compute_dtype: torch.dtype = torch.float32,
) -> None:
    """Fill ``entropy`` of generations that lack it (vllm) with the full-vocabulary entropy of
    the tempered next-token distribution at each response position, from a forward pass of
    ``model`` (the weights that sampled them) in ``compute_dtype`` (the engine's).
    contexts[i]: the tokens before generations[i]."""
    todo = [i for i, g in enumerate(generations) if g.entropy is None]
    was_training = model.training
    model.eval()
    for start in range(0, len(todo), micro_batch_size):
        rows = todo[start : start + micro_batch_size]
        batch = make_sequence_batch(  # pad id 0: padding is masked out of the forward
            [contexts[i] for i in rows], [generations[i].token_ids.tolist() for i in rows], 0
        )
        with autocast_to(compute_dtype, model):
            _, entropy = response_logprobs(model, batch, temperature if temperature > 0 else 1.0, with_entropy=True)
        assert entropy is not None
        for j, i in enumerate(rows):
            generations[i].entropy = entropy[j, : len(generations[i].token_ids)].float().cpu()
    if was_training:
        model.train()
