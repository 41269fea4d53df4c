"""The optimizer step (semrl.update.optim.Optimization): non-finite updates skipped and counted."""

from __future__ import annotations

import pytest
import torch

from semrl.config.load import load_config


def test_optimization_skips_non_finite_updates_and_counts_them_in_a_row():
    from semrl.core.distributed import ProcessGroup
    from semrl.update.optim import Optimization
    from semrl.update.settings import UpdateConfig

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    cfg = load_config(None, ["trainer.lr=0.1"])
    optim = Optimization(
        model,
        UpdateConfig.from_config(cfg),
        ProcessGroup(),
        steps=4,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
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
