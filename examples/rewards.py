"""Example reward functions for ``reward.functions`` (README "Your own rewards")."""

from __future__ import annotations

from typing import Any


def boxed_format(
    prompts: list[str], completions: list[str], completion_ids: list[list[int]], **kwargs: Any
) -> list[float]:
    """TRL style: 1 if the completion puts an answer in \\boxed{}, else 0."""
    return [1.0 if "\\boxed{" in completion else 0.0 for completion in completions]


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> float:
    """verl style: 1 if the completion ends with the gold answer, else 0."""
    return 1.0 if solution_str.strip().rstrip(".}").endswith(str(ground_truth)) else 0.0
