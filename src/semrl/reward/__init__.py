"""Verifiable rewards: answer extraction and math-verify in killable processes."""

from __future__ import annotations

from dataclasses import dataclass

from semrl.reward.extract import extract_answer, extract_boxed, extract_last_number
from semrl.reward.verify import Verdict, VerifierPool

__all__ = [
    "RewardResult",
    "Verdict",
    "VerifierPool",
    "extract_answer",
    "extract_boxed",
    "extract_last_number",
    "score_responses",
]


@dataclass(frozen=True)
class RewardResult:
    reward: float
    answer: str | None
    correct: bool
    timed_out: bool


def score_responses(
    pool: VerifierPool,
    responses: list[str],
    golds: list[str],
    *,
    final_number_fallback: bool,
    truncated: list[bool] | None = None,
    truncated_reward: float | None = None,
) -> list[RewardResult]:
    """Binary correctness reward (1 / 0) per response, gold answer compared first."""
    answers = [extract_answer(text, final_number_fallback) for text in responses]
    verdicts = pool.verify_many(list(zip(golds, answers, strict=True)))
    results = []
    for i, (answer, verdict) in enumerate(zip(answers, verdicts, strict=True)):
        reward = 1.0 if verdict.correct else 0.0
        if truncated is not None and truncated[i] and truncated_reward is not None:
            reward = truncated_reward
        results.append(RewardResult(reward, answer, verdict.correct, verdict.timed_out))
    return results
