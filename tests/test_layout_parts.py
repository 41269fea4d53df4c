"""The pieces the second architecture pass made: atomic directories, the curriculum object, the
optimizer's skipped-update count, the passes before an update, and the config check that replaced
the rule each method wrote for itself."""

from __future__ import annotations

import pytest
import torch

from semrl.config.load import load_config
from semrl.config.sections import ConfigError
from semrl.core.atomic import atomic_directory, write_text_atomic
from semrl.data import Problem
from semrl.data.curriculum import Curriculum


def test_atomic_directory_appears_whole_or_not_at_all(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("crash while writing")
    assert not final.exists() and list(tmp_path.iterdir()) == []  # the temporary is gone too
    with atomic_directory(final) as tmp:
        (tmp / "a.txt").write_text("whole")
    assert (final / "a.txt").read_text() == "whole" and [p.name for p in tmp_path.iterdir()] == ["out"]
    with atomic_directory(final) as tmp:  # replaces the previous version
        (tmp / "b.txt").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["b.txt"]
    with pytest.raises(OSError):  # without replace, an existing non-empty directory stays
        with atomic_directory(final, replace=False) as tmp:
            (tmp / "c.txt").write_text("loser")
    assert sorted(p.name for p in final.iterdir()) == ["b.txt"] and len(list(tmp_path.iterdir())) == 1


def test_write_text_atomic_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "x.jsonl"
    write_text_atomic(path, "one\n")
    write_text_atomic(path, "two\n")
    assert path.read_text() == "two\n" and [p.name for p in path.parent.iterdir()] == ["x.jsonl"]


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


def test_optimization_skips_non_finite_updates_and_counts_them_in_a_row():
    from semrl.core.distributed import ProcessGroup
    from semrl.update.optim import Optimization

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    cfg = load_config(None, ["trainer.lr=0.1"])
    optim = Optimization(
        model, cfg, ProcessGroup(), steps=4, scaler=torch.amp.GradScaler("cpu", enabled=False)
    )
    before = model.weight.detach().clone()
    for expected_count, value in [(1, float("nan")), (2, float("inf")), (0, 1.0), (1, float("nan"))]:
        loss = model(torch.ones(1, 3)).sum() * value
        loss.backward()
        _, applied = optim.step([loss.item()])
        assert applied == (expected_count == 0) and optim.consecutive_bad_updates == expected_count
        if expected_count:
            assert model.weight.grad is None  # the bad gradient is dropped, not kept for the next step
    assert not torch.equal(model.weight, before)  # the finite update was applied
    first = optim.optimizer
    optim.restart(steps=2)
    assert optim.optimizer is not first and optim.lr == pytest.approx(0.1)


def test_fsdp_on_vllm_refuses_a_rollout_that_needs_an_entropy_forward():
    fsdp_vllm = ["trainer.fsdp=true", "rollout.engine=vllm"]
    cases = [
        ("rose", "rose.entropy_mode=full_vocab", "rose.entropy_mode=topk_logprobs"),
        ("fr3e", "fr3e.anchor_metric=entropy", "fr3e.anchor_metric=surprisal"),
    ]
    pytest.importorskip("vllm")
    for method, needs, fine in cases:
        with pytest.raises(ConfigError, match=f"cannot run a forward pass for entropies \\({needs}\\)"):
            load_config(None, [f"algorithm.method={method}", needs, *fsdp_vllm])
        load_config(None, [f"algorithm.method={method}", fine, *fsdp_vllm])
        load_config(None, [f"algorithm.method={method}", needs, "trainer.fsdp=true"])  # hf: the forward runs
