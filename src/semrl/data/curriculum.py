"""SENT's semantic-entropy curriculum (docs/algorithms.md "SENT: curriculum"), as data: a scored
file read back (``load_curriculum``), split into stages (``curriculum_stages``, sorted by entropy,
easy (low) first, equal stages) that the trainer runs in order (``Curriculum``). The scores come
from ``semrl.evaluation.difficulty.score_problems``, which samples; this module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from semrl.data import DataError, EpochSampler, Problem, load_problems

SCORE_FIELD = "semantic_entropy"


def load_curriculum(path: str | Path) -> list[tuple[Problem, float]]:
    """(problem, semantic entropy) pairs from a file written by ``score_problems``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"curriculum file '{path}' does not exist; write it with "
            f"'semrl curriculum score --output {path}' (see configs/sent_demo.yaml)"
        )
    scored = []
    for problem in load_problems(path)[0]:
        value = problem.extra.get(SCORE_FIELD)
        if not isinstance(value, int | float) or isinstance(value, bool) or not np.isfinite(value):
            raise DataError(
                f"{path}: problem '{problem.id}': field '{SCORE_FIELD}' must be a finite number; "
                "score the file with 'semrl curriculum score'"
            )
        scored.append((problem, float(value)))
    return scored


def curriculum_stages(scored: list[tuple[Problem, float]], num_stages: int) -> list[list[Problem]]:
    """Sort by semantic entropy ascending (ties by id) and split into ``num_stages`` stages whose
    sizes differ by at most one."""
    if len(scored) < num_stages:
        raise DataError(
            f"a {num_stages}-stage curriculum needs at least {num_stages} problems, got {len(scored)}"
        )
    ordered = [p for p, _ in sorted(scored, key=lambda x: (x[1], x[0].id))]
    bounds = np.linspace(0, len(ordered), num_stages + 1).round().astype(int)
    return [ordered[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@dataclass(frozen=True)
class StageSchedule:
    """Which steps each curriculum stage trains: stage k trains steps [ends[k-1], ends[k])."""

    ends: tuple[int, ...]

    @classmethod
    def even(cls, num_stages: int, steps: int) -> StageSchedule:
        """``steps`` split as evenly as possible over ``num_stages`` stages."""
        return cls(tuple(round((k + 1) * steps / num_stages) for k in range(num_stages)))

    def steps_of(self, stage: int) -> int:
        return self.ends[stage] - (self.ends[stage - 1] if stage > 0 else 0)

    def advances_at(self, stage: int, step: int) -> bool:
        """Whether a run in ``stage`` that has done ``step`` steps moves to the next stage."""
        return stage + 1 < len(self.ends) and step >= self.ends[stage]


class Curriculum:
    """The training problems stage by stage, and the data order within the current stage (one
    stage for a run without a curriculum). The loop asks ``advances`` after every step.

    Args:
        stages: the problems of each stage, in training order.
        steps: the run's rollout steps, split evenly over the stages (``StageSchedule.even``).
        seed: ``trainer.seed``; stage k's order is drawn with seed + k.
    """

    def __init__(self, stages: list[list[Problem]], steps: int, seed: int) -> None:
        self.stages, self.seed = stages, seed
        self.schedule = StageSchedule.even(len(stages), steps)
        self.enter(0)

    def enter(self, stage: int) -> None:
        self.stage = stage
        self.problems = self.stages[stage]
        self.sampler = EpochSampler(len(self.problems), self.seed + stage)

    def advances(self, step: int) -> bool:
        """Whether the run, having done ``step`` steps, moves to the next stage now."""
        return self.schedule.advances_at(self.stage, step)

    def steps_left_in_stage(self, step: int) -> int:
        return self.schedule.ends[self.stage] - step

    def state_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.enter(state.get("stage", 0))
        self.sampler.load_state_dict(state["sampler"])
