"""Sampling n responses per problem and judging them: each problem's samples decoded, verified and
clustered by answer equivalence (``SampledProblem``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from semrl.data import Problem
from semrl.data.prompts import PromptFormat
from semrl.methods.semantic_entropy import cluster_answers
from semrl.reward import Judge, RewardResult, score_responses
from semrl.rollout.engines import Engine, Generation, GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class SampledProblem:
    """``num_samples`` responses to one problem, verified against its answer and clustered by answer
    equivalence; lists of length ``num_samples``."""

    problem: Problem
    generations: list[Generation]
    texts: list[str]
    rewards: list[RewardResult]  # extracted answer and correctness of each response
    clusters: list[int]  # each answer's equivalence class (semrl.methods.semantic_entropy.cluster_answers)

    def record(self) -> dict[str, Any]:
        """Its problem record (module docstring)."""
        return {
            "id": self.problem.id,
            "gold": self.problem.answer,
            "level": self.problem.level,
            "subject": self.problem.subject,
            "samples": [
                {
                    "response": text,
                    "answer": reward.answer,
                    "correct": reward.correct,
                    "length": len(gen.token_ids),
                    "truncated": gen.truncated,
                    "timed_out": reward.timed_out,
                    "cluster": cluster,
                }
                for gen, text, reward, cluster in zip(
                    self.generations, self.texts, self.rewards, self.clusters, strict=True
                )
            ],
        }


def sample_and_verify(
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    params: SamplingParams,
    num_samples: int,
    prompt: PromptFormat,
    judge: Judge,
    generator: torch.Generator | None = None,
    progress: Callable[[int], Any] | None = None,
) -> list[SampledProblem]:
    """Sample ``num_samples`` responses per problem (prompts in ``prompt``'s format, as in training),
    judge them with ``judge`` and cluster their answers: what evaluation and the SENT curriculum's
    scoring both need.

    An engine that refills finished slots (``EnginePowers.continuous_batching``: vllm) gets every request
    at once (``Engine.generate_dynamic``); the others get chunks of ``engine.batch_size``. Either
    way the requests take their seeds from ``generator`` in the same order, so the samples do not
    depend on the path (docs/evaluation.md, "Continuous batching"). ``progress`` gets a count for
    every finished sample as it finishes, also inside a chunk; a problem is judged as soon as its last
    sample finishes (at the end of its chunk on a chunked engine)."""
    prompt_ids = [prompt.ids(tokenizer, p.problem) for p in problems]
    tagged = [
        ((i, j), GenerationRequest(ids)) for i, ids in enumerate(prompt_ids) for j in range(num_samples)
    ]
    gens: list[list[Generation | None]] = [[None] * num_samples for _ in problems]
    waiting = [num_samples] * len(problems)
    out: list[SampledProblem | None] = [None] * len(problems)

    def finished(tag: tuple[int, int], request: GenerationRequest, generation: Generation) -> list[Any]:
        i, j = tag
        gens[i][j] = generation
        waiting[i] -= 1
        if progress is not None and engine.powers.continuous_batching:  # the others count as rows stop
            progress(1)
        if waiting[i] == 0:
            done = [g for g in gens[i] if g is not None]
            out[i] = judge_samples(problems[i], done, tokenizer, judge)
        return []

    if engine.powers.continuous_batching:
        engine.generate_dynamic(tagged, params, generator, finished)
    else:
        for start in range(0, len(tagged), engine.batch_size):
            chunk = tagged[start : start + engine.batch_size]
            generations = engine.generate([r for _, r in chunk], params, generator, on_finished=progress)
            for (tag, request), generation in zip(chunk, generations, strict=True):
                finished(tag, request, generation)
    return [s for s in out if s is not None]


def judge_samples(
    problem: Problem, gens: list[Generation], tokenizer: PreTrainedTokenizerBase, judge: Judge
) -> SampledProblem:
    """One problem's samples decoded, judged and clustered by answer equivalence."""
    pool, functions, final_number_fallback = judge.pool, judge.functions, judge.final_number_fallback
    # decode is typed str | list[str]; one sequence of ids gives a str
    texts: list[str] = [tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in gens]  # type: ignore[misc]
    if functions is None:
        golds = [problem.answer] * len(gens)
        rewards = score_responses(
            pool,
            texts,
            golds,
            final_number_fallback=final_number_fallback,
            problems=[problem.problem] * len(gens),
        )
    else:
        from semrl.data import problem_columns

        rewards, _ = functions.score(
            pool,
            [problem.problem] * len(gens),
            texts,
            [g.token_ids.tolist() for g in gens],
            [problem_columns(problem)] * len(gens),
            final_number_fallback=final_number_fallback,
        )
    clusters = cluster_answers(
        [r.answer for r in rewards], lambda a, b: pool.verify_many([(a, b)])[0].correct
    )
    return SampledProblem(problem, gens, texts, rewards, clusters)
