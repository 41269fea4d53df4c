"""The curriculum object (semrl.data.curriculum.Curriculum): stage ends, entering a stage, its state."""

from __future__ import annotations

from semrl.data import Problem
from semrl.data.curriculum import Curriculum


def _problems(n: int, tag: str) -> list[Problem]:
    return [Problem(f"{tag}{i}", f"problem {tag}{i}", "1") for i in range(n)]


def test_curriculum_advances_at_the_stage_ends_and_restores_its_place():
    stages = [_problems(5, "a"), _problems(7, "b"), _problems(3, "c")]
    cur = Curriculum(stages, steps=10, seed=3)
    assert cur.schedule.ends == (3, 7, 10)
    assert [step for step in range(11) if cur.advances(step)] == [
        3,
        4,
        5,
        6,
        7,
        8,
        9,
        10,
    ]  # from step 3 on, in stage 0
    order = [cur.problems[i].id for i in cur.sampler.next_indices(4)]
    cur.enter(1)
    assert (
        cur.problems is stages[1]
        and cur.steps_left_in_stage(4) == 3
        and not cur.advances(6)
        and cur.advances(7)
    )
    cur.sampler.next_indices(2)
    state = cur.state_dict()
    expected = cur.sampler.next_indices(5)
    again = Curriculum(stages, steps=10, seed=3)
    again.load_state_dict(state)
    assert again.stage == 1 and again.sampler.next_indices(5) == expected
    fresh = Curriculum(stages, steps=10, seed=3)  # stage 0's order depends on the seed only
    assert [fresh.problems[i].id for i in fresh.sampler.next_indices(4)] == order
    cur.enter(2)
    assert not cur.advances(10)  # the last stage never advances
