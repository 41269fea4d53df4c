"""The seeds of a rollout (``rollout.seed_per_sequence``, docs/engines.md "Tree rollouts on the
engines"): each sampled sequence's, each prompt's tree, each tree node's, and a prompt's own stream,
all derived from the run's seed, the step, the round and the prompt's place in the global batch, so
that the tokens do not depend on the batch, the number of processes or the completion order."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch


def sequence_seed(seed: int, step: int, round_index: int, prompt: int, sample: int) -> int:
    """The seed of one sampled sequence under ``rollout.seed_per_sequence``: sample ``sample`` of
    prompt ``prompt`` (its index in the step's global batch) in rollout round ``round_index``."""
    key = [seed, step, round_index, prompt, sample]
    return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0] >> 1)


def group_seeds(seed: int, step: int, round_index: int, prompts: Iterable[int], size: int) -> list[list[int]]:
    """``sequence_seed`` of every sample of each prompt in ``prompts`` (indices in the global batch)."""
    return [[sequence_seed(seed, step, round_index, p, j) for j in range(size)] for p in prompts]


TREE = 2**31  # the sample index of a prompt's tree seed: no sequence of a group has it


def prompt_seed(seed: int, step: int, round_index: int, prompt: int) -> int:
    """The seed of prompt ``prompt``'s tree (its index in the step's global batch) in rollout round
    ``round_index``; ``node_seed`` derives each request's seed from it."""
    return sequence_seed(seed, step, round_index, prompt, TREE)


NODE_STREAM, PROMPT_STREAM = 1, 0  # the two kinds of stream derived from a prompt's seed


def node_seed(prompt_seed: int, node: int) -> int:
    """The sampling seed of tree node ``node`` (its index among the prompt's requests, fixed by the
    method's rule, never by completion order) of a prompt whose tree draws from ``prompt_seed``.
    A tree's tokens then do not depend on the batch limit or on which request finishes first
    (docs/engines.md, "Tree rollouts on the engines")."""
    key = [prompt_seed, NODE_STREAM, node]
    return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0] >> 1)


def prompt_generator(prompt_seed: int) -> torch.Generator:
    """The random stream of a prompt's own choices (TreePO's first fork width and fallback cuts)."""
    key = [prompt_seed, PROMPT_STREAM]
    state = np.random.SeedSequence(key).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state >> 1))


def draw_seed(generator: torch.Generator | None) -> int:
    """One seed drawn from ``generator`` (the process's default stream where None)."""
    return int(torch.randint(2**62, (1,), generator=generator))


def seeds_or_draw(
    prompt_seeds: Sequence[int] | None, count: int, generator: torch.Generator | None
) -> list[int]:
    """The seeds of ``count`` prompts: ``prompt_seeds`` (the trainer's ``prompt_seed`` of each), or,
    where there are none, one drawn for each from ``generator``."""
    if prompt_seeds is None:
        return [draw_seed(generator) for _ in range(count)]
    check_seed_count(prompt_seeds, count)
    return list(prompt_seeds)


def check_seed_count(prompt_seeds: Sequence[int | None] | None, count: int) -> None:
    """Refuse a number of prompt seeds other than the number of prompts."""
    if prompt_seeds is not None and len(prompt_seeds) != count:
        raise ValueError(f"{len(prompt_seeds)} prompt seeds for {count} prompts")
