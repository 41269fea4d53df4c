"""The settings the update reads, as one frozen view built once from the run's config: the Actor and
the optimizer take it instead of the whole ``Config`` (the ``trainer`` section, the rollout batch's
size and its temperature)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from semrl.config.sections import Config


@dataclass(frozen=True)
class UpdateConfig:
    """What the update reads of a run's config (docs/config-reference.md, ``trainer``).

    Attributes:
        temperature: the temperature log-probs are computed at: ``rollout.temperature``, 1 for greedy.
        batch_rows: rows of one rollout batch, over every process (prompts_per_step x group_size).
        ppo_epochs, mini_batch_size, micro_batch_size, micro_batch_tokens, logits_chunk_size: as
            ``trainer.*``; ``mini_batch_size`` None: the whole rollout batch.
        lr, betas, weight_decay, warmup_steps, lr_schedule, max_grad_norm: AdamW and its schedule.
        fsdp: the gradients are reduce-scattered during backward (``trainer.fsdp``).
    """

    temperature: float
    batch_rows: int
    ppo_epochs: int
    mini_batch_size: int | None
    micro_batch_size: int
    micro_batch_tokens: int | None
    logits_chunk_size: int
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    warmup_steps: int
    lr_schedule: str
    max_grad_norm: float
    fsdp: bool

    @classmethod
    def from_config(cls, cfg: Config) -> UpdateConfig:
        t, r = cfg.trainer, cfg.rollout
        beta1, beta2 = t.betas  # a list of two, checked when the config loads
        return cls(
            temperature=r.temperature if r.temperature > 0 else 1.0,
            batch_rows=r.prompts_per_step * r.group_size,
            ppo_epochs=t.ppo_epochs,
            mini_batch_size=t.mini_batch_size,
            micro_batch_size=t.micro_batch_size,
            micro_batch_tokens=t.micro_batch_tokens,
            logits_chunk_size=t.logits_chunk_size,
            lr=t.lr,
            betas=(beta1, beta2),
            weight_decay=t.weight_decay,
            warmup_steps=t.warmup_steps,
            lr_schedule=t.lr_schedule,
            max_grad_norm=t.max_grad_norm,
            fsdp=t.fsdp,
        )

    @property
    def updates_per_step(self) -> int:
        """Optimizer steps per rollout step: PPO epochs x mini-batches."""
        return self.ppo_epochs * (self.batch_rows // (self.mini_batch_size or self.batch_rows))
