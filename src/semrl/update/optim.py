"""The optimizer: AdamW, its learning-rate schedule, and a step that skips non-finite updates and
counts how many in a row it skipped."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from semrl.core.distributed import ProcessGroup
from semrl.update.settings import UpdateConfig


def make_optimizer(model: torch.nn.Module, t: UpdateConfig, steps: int) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW and its learning-rate schedule (warm-up, then constant / cosine / linear) over
    ``steps`` rollout steps."""
    trained = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    optimizer = torch.optim.AdamW(trained, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    total_updates = steps * t.updates_per_step

    def factor(update: int) -> float:
        if t.warmup_steps > 0 and update < t.warmup_steps:
            return (update + 1) / t.warmup_steps
        progress = (update - t.warmup_steps) / max(1, total_updates - t.warmup_steps)
        if t.lr_schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        if t.lr_schedule == "linear":
            return max(0.0, 1.0 - progress)
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def guarded_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    processes: ProcessGroup,
    max_grad_norm: float,
    sum_gradients: bool,
    losses: list[float],
    scaler: torch.amp.GradScaler | None = None,
) -> tuple[float, bool]:
    """One optimizer update from the accumulated gradients: summed over processes (unless FSDP
    already reduced them, ``sum_gradients=False``), unscaled (float16 loss scaling), clipped to
    ``max_grad_norm``, and applied only when the gradient norm and every process's micro-batch
    ``losses`` are finite; otherwise the weights stay as they were (and the loss scale backs off).
    The scheduler advances either way. Returns (grad norm, applied)."""
    if sum_gradients:
        processes.sum_gradients(model.parameters())
    if scaler is not None:  # a disabled scaler (no float16) does nothing
        scaler.unscale_(optimizer)
    grad_norm = processes.scalar(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    finite = bool(torch.isfinite(grad_norm)) and processes.all_true(all(math.isfinite(v) for v in losses))
    if finite:
        optimizer.step()
    if scaler is not None:
        scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.item(), finite


class Optimization:
    """The trained model's optimizer, schedule and float16 loss scaler, with the guarded step
    (``guarded_step``) and its count of consecutive skipped updates (``trainer.max_bad_updates``).

    Args:
        steps: rollout steps the schedule spans (a curriculum stage's with
            ``data.curriculum_reset_optimizer``).
        scaler: the loss scaler of float16 compute (disabled otherwise).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        settings: UpdateConfig,
        processes: ProcessGroup,
        steps: int,
        scaler: torch.amp.GradScaler,
    ) -> None:
        self.model, self.settings, self.processes, self.scaler = model, settings, processes, scaler
        self.optimizer, self.scheduler = make_optimizer(model, settings, steps)
        self.consecutive_bad_updates = 0

    def restart(self, steps: int) -> None:
        """A fresh optimizer and schedule over ``steps`` rollout steps (a new curriculum stage)."""
        self.optimizer, self.scheduler = make_optimizer(self.model, self.settings, steps)

    @property
    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def step(self, losses: list[float]) -> tuple[float, bool]:
        """Apply the accumulated gradients (``losses``: this process's micro-batch losses) unless they
        are not finite; returns (grad norm, applied) and counts consecutive skipped updates."""
        grad_norm, applied = guarded_step(
            self.model,
            self.optimizer,
            self.scheduler,
            self.processes,
            self.settings.max_grad_norm,
            not self.settings.fsdp,  # FSDP reduce-scatters the gradients during backward
            losses,
            self.scaler,
        )
        self.consecutive_bad_updates = 0 if applied else self.consecutive_bad_updates + 1
        return grad_norm, applied
