"""What a method's tensor functions receive and return (``semrl.methods.registry`` names them).

``RolloutContext`` and ``MethodRollout`` are a method's rollout's input and output;
``AdvantageInputs`` is what its advantage estimator reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from semrl.methods.registry import MethodConfig
from semrl.rollout.batch import GroupInfo
from semrl.rollout.engines import Engine, Generation, GenerationRequest, SamplingParams
from semrl.rollout.seeds import seeds_or_draw
from semrl.rollout.tree_kit import SamplingEntropyFn


@dataclass(frozen=True)
class RolloutContext:
    """What a method's rollout may use.

    Attributes:
        engine: the sampling engine (``semrl.rollout.engines.Engine``), at the current weights.
        params: the training sampler (temperature, top-p/k, response budget, top-k log-probs).
        generator: the process's random stream; every random choice of the rollout draws from it.
        config: the method's options and the ``algorithm`` and ``rollout`` sections.
        state: the method's own state, made once per run by ``MethodSpec.new_state`` (or None); it is
            not checkpointed, so a method whose results depend on it does not resume exactly.
        sampling_entropy: (contexts, generations) -> the generations with their full-vocabulary
            sampling entropy: new objects for those an engine left without it (vllm), from the
            trainer's forward at the sampling weights; the others as they are. None: no forward; a
            method that reads the entropy is then refused on an engine that computes none.
        decode: token ids -> text with the run's tokenizer, special tokens skipped (TreePO's stop
            tests read a segment's text).
        step: the training step this rollout is for (rollouts whose settings follow a schedule).
        prompt_seeds: one seed per prompt, from the run's seed, the step, the sampling round and
            the prompt's place in the global batch (``rollout.seeds.prompt_seed``); a tree method derives
            every request's seed from it and its node (``rollout.seeds.node_seed``), so its tokens do not
            depend on scheduling or on the number of processes. None: drawn from ``generator``.
        sample_seeds: independent sampling's seeds, one per prompt and sample
            (``rollout.seed_per_sequence``: ``rollout.seeds.sequence_seed``); None: drawn from
            ``generator``.
    """

    engine: Engine
    params: SamplingParams
    generator: torch.Generator
    config: MethodConfig[Any]
    sampling_entropy: SamplingEntropyFn | None = None
    state: Any = None
    decode: Callable[[list[int]], str] | None = None
    step: int = 0
    prompt_seeds: list[int] | None = None
    sample_seeds: list[list[int]] | None = None

    @property
    def group_size(self) -> int:
        return self.config.rollout.group_size

    def seeds_of_prompts(self, count: int) -> list[int]:
        """``prompt_seeds``, or ``count`` seeds drawn from ``generator`` when there are none."""
        return seeds_or_draw(self.prompt_seeds, count, self.generator)


@dataclass
class MethodRollout:
    """A method's rollout of P prompts.

    Attributes:
        generations: (P * G) responses, prompt-major, G = rollout.group_size per prompt.
        groups: (P) what the method records about each prompt group (tree, branch points, its own
            data); None: nothing.
        sequence_prompt_ids: (P * G) the prompt each response continues, when it is not the
            problem's prompt (FR3E: prompt + the anchor's prefix, which is then not trained on).
        metrics: the rollout's metrics for the step (averaged over rollout rounds).
    """

    generations: list[Generation]
    groups: list[GroupInfo] | None = None
    sequence_prompt_ids: list[list[int]] | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def independent_rollout(ctx: RolloutContext, prompt_ids: list[list[int]]) -> MethodRollout:
    """G independent samples of each prompt, prompt-major, in one engine call: the rollout of every
    method without one of its own (``MethodSpec.rollout_fn`` None). Sample j of prompt p draws from
    ``sample_seeds[p][j]`` when the context has them."""
    group, seeds = ctx.group_size, ctx.sample_seeds
    requests = [
        GenerationRequest(ids, seed=None if seeds is None else seeds[p][j])
        for p, ids in enumerate(prompt_ids)
        for j in range(group)
    ]
    return MethodRollout(ctx.engine.generate(requests, ctx.params, ctx.generator))


@dataclass
class AdvantageInputs:
    """What an advantage estimator may read. N sequences, T response positions.

    Attributes:
        rewards: (N,) scalar reward per sequence.
        group_ids: (N,) prompt group of each sequence (groups are contiguous, G rows each).
        response_mask: (N, T) 1 on response tokens.
        groups: (N / G) the rollout's record of each group (``MethodRollout.groups``).
        answers: (N,) extracted final answer of each response (None: none found).
        correct: (N,) whether each answer was verified correct (the reward before shaping).
        logprobs: (N, T) rollout log-probs of the sampled tokens (0 on padding).
    """

    rewards: torch.Tensor
    group_ids: torch.Tensor
    response_mask: torch.Tensor
    groups: list[GroupInfo] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    logprobs: torch.Tensor | None = None


# (inputs, the method's config) -> ((N, T) advantages, metrics)
AdvantageFn = Callable[[AdvantageInputs, MethodConfig[Any]], tuple[torch.Tensor, dict[str, float]]]
# (context, prompt token ids) -> the method's rollout
RolloutFn = Callable[[RolloutContext, list[list[int]]], MethodRollout]
