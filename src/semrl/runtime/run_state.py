"""A run's state across checkpoints: what a checkpoint saves besides the weights (``RunState``),
saving and restoring it exactly, and a curriculum's stage change (SENT: a checkpoint at the
boundary, the optimizer restarted, the reference swapped for the policy of the stage's start). The
files themselves are ``semrl.runtime.checkpoint``'s."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from semrl.core.distributed import (
    full_optimizer_state,
    full_state_dict,
    iter_full_parameters,
    load_optimizer_state,
    load_streamed,
)
from semrl.methods.entropy_bonus import EntropyBonus
from semrl.runtime.checkpoint import (
    checkpoint_dir,
    latest_checkpoint,
    load_trainer_state,
    process_rng_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from semrl.config.sections import Config
    from semrl.core.distributed import ProcessGroup
    from semrl.data.curriculum import Curriculum
    from semrl.runtime.environment import RunEnvironment
    from semrl.runtime.setup import Models
    from semrl.update.optim import Optimization


logger = logging.getLogger(__name__)


@dataclass
class RunState:
    """What a checkpoint saves besides the weights, live; restoring it continues the run exactly.

    Attributes:
        step: rollout steps done.
        curriculum: the curriculum stage and the data order within it.
        optim: optimizer, schedule, loss scaler and the count of consecutive skipped updates.
        generator: this process's random stream (saved with the global torch, numpy, python RNGs).
        entropy_bonus: the entropy bonus's coefficient and, when adaptive, its state.
    """

    step: int
    curriculum: Curriculum
    optim: Optimization
    generator: torch.Generator
    entropy_bonus: EntropyBonus = field(default_factory=EntropyBonus)


def full_weights(model: torch.nn.Module, fsdp: bool) -> dict[str, torch.Tensor] | None:
    """The trained weights whole, a collective under FSDP that gathers them into the main process's
    CPU memory (the others get {}); None when ``model`` is not sharded (its own weights, or the hf
    engine's full copy of them, are whole already)."""
    return full_state_dict(model) if fsdp else None


def save_run(env: RunEnvironment, run: RunState, models: Models, cfg: Config) -> Path:
    """Checkpoint of the run at ``run.step`` in ``env.run_dir``, written by the main process (a
    collective: every process calls it): the trained model's weights (whole, from
    ``models.rollout_model`` or gathered under FSDP), the tokenizer and ``run``."""
    run_dir, processes, model = env.run_dir, env.processes, models.model
    rngs = processes.gather(rng_state(run.generator))
    fsdp, optim = cfg.trainer.fsdp, run.optim
    state = {
        "step": run.step,
        "optimizer": full_optimizer_state(model, optim.optimizer) if fsdp else optim.optimizer.state_dict(),
        "scheduler": optim.scheduler.state_dict(),
        "sampler": run.curriculum.sampler.state_dict(),
        "rng": rngs if processes.distributed else rngs[0],
        "consecutive_bad_updates": optim.consecutive_bad_updates,
        "grad_scaler": optim.scaler.state_dict(),
        "stage": run.curriculum.stage,
        "entropy_bonus": run.entropy_bonus.state_dict(),
        "config": cfg.to_dict(),
    }
    path = checkpoint_dir(run_dir, run.step)
    weights = full_weights(model, fsdp)
    if processes.is_main:
        path = save_checkpoint(
            run_dir,
            run.step,
            models.rollout_model,
            models.tokenizer,
            state,
            cfg.logging.keep_last,
            model_state=weights,
            faults=env.faults,
        )
    processes.barrier()
    return path


def restore_run(
    ckpt: Path, run: RunState, model: torch.nn.Module, cfg: Config, processes: ProcessGroup
) -> None:
    """Load the checkpoint's trainer state into ``run``: the curriculum stage and data order (with
    ``data.curriculum_reset_optimizer`` a later stage's fresh optimizer first), optimizer, schedule,
    loss scaler, RNG states, step and skipped-update count."""
    state = load_trainer_state(ckpt)
    run.curriculum.load_state_dict(state)
    if run.curriculum.stage > 0 and cfg.data.curriculum_reset_optimizer:
        run.optim.restart(run.curriculum.schedule.steps_of(run.curriculum.stage))
    if cfg.trainer.fsdp:
        load_optimizer_state(model, run.optim.optimizer, state["optimizer"])
    else:
        run.optim.optimizer.load_state_dict(state["optimizer"])
    run.optim.scheduler.load_state_dict(state["scheduler"])
    if state.get("grad_scaler"):
        run.optim.scaler.load_state_dict(state["grad_scaler"])
    set_rng_state(process_rng_state(state, ckpt, processes.rank, processes.world), run.generator)
    run.step = state["step"]
    run.optim.consecutive_bad_updates = state.get("consecutive_bad_updates", 0)
    if "entropy_bonus" in state:  # checkpoints from before the entropy bonus have none
        run.entropy_bonus.load_state_dict(state["entropy_bonus"])


# --------------------------------------------------------------------------------------------
# A curriculum stage's KL reference (data.curriculum_reset_optimizer)


def stage_reference_dir(run_dir: Path, stage: int) -> Path:
    """Where the weights a stage starts from are kept as its KL reference (``curriculum_reset_optimizer``)."""
    return run_dir / "curriculum" / f"stage-{stage}"


def stage_reference_dirs(run_dir: Path) -> list[Path]:
    """Every stage reference directory of a run, in stage order."""
    return sorted((run_dir / "curriculum").glob("stage-*"), key=lambda d: int(d.name.split("-")[1]))


def advance_stage(env: RunEnvironment, run: RunState, models: Models, cfg: Config) -> None:
    """Checkpoint, then move the run to its curriculum's next stage (a collective). With
    ``data.curriculum_reset_optimizer`` the new stage starts like a run from the previous stage's
    final checkpoint: fresh optimizer and schedule, and those weights as the KL reference (kept in
    the run directory for a resume)."""
    save_run(env, run, models, cfg)
    curriculum = run.curriculum
    curriculum.enter(curriculum.stage + 1)
    logger.info(
        "curriculum: stage %d of %d from step %d", curriculum.stage + 1, len(curriculum.stages), run.step
    )
    if not cfg.data.curriculum_reset_optimizer:
        return
    run.optim.restart(curriculum.steps_left_in_stage(run.step))
    if models.ref_model is not None:
        save_stage_reference(env, models, curriculum.stage, run.step, cfg.trainer.fsdp)


def save_stage_reference(env: RunEnvironment, models: Models, stage: int, step: int, fsdp: bool) -> None:
    """Make the current weights stage ``stage``'s reference: loaded into every process's
    ``models.ref_model`` (under FSDP one gathered parameter at a time) and kept under
    ``stage_reference_dir`` by the main process for a resume (a collective)."""
    model, rollout_model, ref_model = models.model, models.rollout_model, models.ref_model
    if ref_model is None:
        raise ValueError("a stage's reference needs the run's reference model (models.ref_model is None)")
    weights = full_weights(model, fsdp)  # FSDP: the main process's
    if weights is None:
        ref_model.load_state_dict(rollout_model.state_dict())
    else:
        load_streamed(ref_model, iter_full_parameters(model))
    if env.processes.is_main:
        save_checkpoint(
            stage_reference_dir(env.run_dir, stage),
            step,
            rollout_model,
            models.tokenizer,
            {},
            1,
            model_state=weights,
            faults=env.faults,
        )
    env.processes.barrier()


def load_stage_reference(run_dir: Path, stage: int, ref_model: PreTrainedModel, dtype: str) -> None:
    """On resume in a later stage: its reference, the weights the stage started from."""
    from semrl.models.loading import load_model

    reference = latest_checkpoint(stage_reference_dir(run_dir, stage))
    if reference is not None:
        stage_start = load_model(str(reference), dtype)
        load_streamed(ref_model, stage_start.named_parameters(remove_duplicate=False))
