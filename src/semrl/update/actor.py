"""The update stage's owner (verl's actor): the trained model and its reference, their precision,
packing and micro-batch plan, the policy loss and the optimizer.

The trainer calls it once per step: ``Actor.update(batch, advantages, step)`` draws epoch 0's row
order, runs the no-gradient forwards the step needs (old-policy and reference log-probs, and the
sampling entropies an engine without them left: ``PolicyPasses``), then the PPO epochs over
mini-batches and micro-batches and the optimizer steps, and returns finished values
(``UpdateResult``). The only collectives are the ones written here (a micro-batch count every
process agrees on, token and entropy sums over processes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from semrl.core.distributed import ProcessGroup
from semrl.core.faults import NO_FAULTS, Faults
from semrl.core.timing import PhaseClock
from semrl.methods.entropy_bonus import EntropyBonus
from semrl.methods.losses import masked_mean
from semrl.methods.policy_loss import LossFn, MiniBatchInputs, PolicyLossInputs, PrepareFn, micro_batch_loss
from semrl.methods.registry import MethodConfig
from semrl.models.precision import Precision
from semrl.rollout.batch import RolloutBatch
from semrl.update.micro_batches import micro_batches, shuffled_rows
from semrl.update.old_logprobs import FirstForward, plan_old_logprobs
from semrl.update.optim import Optimization
from semrl.update.row_logprobs import batch_logprobs, rows_logprobs
from semrl.update.settings import UpdateConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class PolicyModels:
    """The models an update reads.

    Attributes:
        model: the trained model (a PreTrainedModel, wrapped by FSDP under ``trainer.fsdp``).
        ref_model: the reference, or None when nothing reads it; under LoRA the trained model itself.
        reference_weights: a context in which ``ref_model`` is the reference (under LoRA: the
            adapters switched off); a no-op otherwise.
        precision: the trained model's compute dtype and loss scaling.
        packing: whether rows go through the model tree-packed (``semrl.update.packing``).
    """

    model: torch.nn.Module
    ref_model: PreTrainedModel | None
    reference_weights: Callable[[], AbstractContextManager[Any]]
    precision: Precision
    packing: bool


@dataclass(frozen=True)
class LoadedLoss:
    """The policy loss as the registry loaded it: its loss function, its optional per-mini-batch
    preparation (a token selection) and the config they read (``semrl.methods.policy_loss``)."""

    loss_fn: LossFn
    prepare_fn: PrepareFn | None
    config: MethodConfig[Any]


@dataclass(frozen=True)
class ActorState:
    """What the update changes and a checkpoint saves (``RunState`` holds the same objects, restored
    in place): the optimizer with its schedule and loss scaler, the entropy bonus's coefficient, and
    this process's random stream (row orders, Clip-Cov's random choice)."""

    optim: Optimization
    bonus: EntropyBonus
    generator: torch.Generator


@dataclass(frozen=True)
class PolicyPasses:
    """The no-gradient forwards a step needs before its update; each (N, T) or None.

    Attributes:
        old_logp: the behaviour policy's log-probs (the weights that sampled), when the update takes
            more than one optimizer step; None: on-policy, the ratio is exactly 1.
        ref_logp: the reference model's log-probs, when a KL term or ``log_ref_kl`` needs them.
        sampling_entropy: full-vocabulary entropies at the sampling weights, when the engine gave none
            (vllm) and the old-policy pass runs anyway or a token selection needs them before the
            update; otherwise the update's first forward measures them.
        first_forward_rows: (N,) bool, the rows whose old log-probs and sampling entropies the
            update's first forward gives (``plan_old_logprobs``); None: none.
    """

    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    sampling_entropy: torch.Tensor | None = None
    first_forward_rows: torch.Tensor | None = None


@dataclass
class MiniBatch:
    """The rows of one optimizer step and what their micro-batches share."""

    rows: torch.Tensor  # (n,) rows of the batch
    plan: list[torch.Tensor]  # positions into rows of each micro-batch
    selection: dict[str, torch.Tensor]  # the policy loss's per-token selection, (n, T) each
    num_tokens: int  # response tokens of the mini-batch over every process


@dataclass(frozen=True)
class UpdateResult:
    """What an update returns: its metrics, and the (N, T) entropies at the sampling weights that its
    forwards measured when the batch had none (vllm), else None."""

    metrics: dict[str, float]
    sampling_entropy: torch.Tensor | None = None


class Actor:
    """The trained model's update: its forwards, the policy loss and the optimizer steps.

    Args:
        settings: what the update reads of the run's config (``UpdateConfig.from_config``).
        models: the trained model, the reference, their precision and packing.
        loss: the policy loss's functions and the config they read.
        state: the optimizer, the entropy bonus and the random stream the update advances.
        processes: the processes training together.
        reuse_first_forward: the first mini-batch reuses the forward that gave its old log-probs
            (exact: it runs before any optimizer step); False runs a separate pass, for the tests and
            the benchmark that compare the two.
        faults: where a test makes the update fail (``semrl.core.faults``).
    """

    def __init__(
        self,
        settings: UpdateConfig,
        models: PolicyModels,
        loss: LoadedLoss,
        state: ActorState,
        processes: ProcessGroup,
        *,
        reuse_first_forward: bool = True,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.settings, self.processes = settings, processes
        self.models = models
        self.loss_fn, self.prepare_fn, self.loss_config = loss.loss_fn, loss.prepare_fn, loss.config
        self.optim, self.bonus, self.generator = state.optim, state.bonus, state.generator
        self.reuse_first_forward, self.faults = reuse_first_forward, faults
        self.temperature = settings.temperature

    def mini_batch_size(self, batch: RolloutBatch) -> int:
        """This process's rows per optimizer step."""
        mini = self.settings.mini_batch_size
        return mini // self.processes.world if mini else len(batch.generations)

    def micro_batch_plan(self, batch: RolloutBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """Positions into ``rows`` of each micro-batch. Under a token budget every process runs as
        many micro-batches as the process that needs most (FSDP's collectives run once per forward
        on every process): a collective, so every process plans the same mini-batches."""
        t = self.settings
        plan = micro_batches(batch, rows, t.micro_batch_size, t.micro_batch_tokens, self.models.packing)
        if t.micro_batch_tokens is not None:
            wanted = max(self.processes.gather(len(plan)))
            if wanted != len(plan):
                plan = micro_batches(
                    batch, rows, t.micro_batch_size, t.micro_batch_tokens, self.models.packing, count=wanted
                )
        return plan

    def _row_batches(self, batch: RolloutBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """Row indices of each micro-batch of ``rows``."""
        return [rows[positions] for positions in self.micro_batch_plan(batch, rows)]

    def update(
        self, batch: RolloutBatch, advantages: torch.Tensor, step: int, clock: PhaseClock | None = None
    ) -> UpdateResult:
        """The update of rollout step ``step`` from the batch and its (N, T) advantages: epoch 0's row
        order (drawn first: the passes leave its first mini-batch's old log-probs to that step's own
        forward, docs/algorithms.md, "Old log-probs"), the no-gradient passes, then the PPO epochs.
        ``clock`` receives the phases' wall seconds (old_logprobs, ref_logprobs, forward, backward,
        optimizer); a new one when None."""
        clock = PhaseClock() if clock is None else clock
        order = self._first_order(batch)
        passes = self._passes(batch, order, clock)
        return self._epochs(batch, advantages, passes, order, step, clock)

    def _first_order(self, batch: RolloutBatch) -> torch.Tensor:
        """Epoch 0's row order, drawn before the passes, which leave its first mini-batch's old
        log-probs to the update."""
        return shuffled_rows(len(batch.generations), batch.group_size, self.models.packing, self.generator)

    def on_policy(self, batch: RolloutBatch) -> bool:
        """One epoch in one mini-batch: old log-probs equal the current ones (docs/algorithms.md)."""
        return self.settings.ppo_epochs == 1 and self.mini_batch_size(batch) == len(batch.generations)

    def _passes(self, batch: RolloutBatch, first_order: torch.Tensor, clock: PhaseClock) -> PolicyPasses:
        """The no-gradient forwards before the update: the old-policy pass as ``plan_old_logprobs``
        plans it (old log-probs unless on-policy; rollout entropies when the batch lacks them and a
        token selection reads them before the update or the pass runs anyway, docs/engines.md), and
        the reference's log-probs when there is a reference."""
        first = first_order[: self.mini_batch_size(batch)] if self.reuse_first_forward else None
        plan = plan_old_logprobs(
            len(batch.generations),
            first,
            on_policy=self.on_policy(batch),
            has_sampling_entropy=batch.has_sampling_entropy,
            entropy_before_update=self.prepare_fn is not None,
        )
        old_logp = sampling_entropy = ref_logp = None
        chunk = self.settings.logits_chunk_size
        if plan.pass_rows is not None:
            with clock.phase("old_logprobs"), self.models.precision.autocast(self.models.model):
                logp, sampling_entropy = batch_logprobs(
                    self.models.model,
                    batch,
                    self.temperature,
                    self._row_batches(batch, plan.pass_rows) if len(plan.pass_rows) else [],
                    packed=self.models.packing,
                    with_entropy=plan.pass_entropy,
                    chunk_size=chunk,
                )
            old_logp = logp if plan.old_logp_from_pass else None
        if self.models.ref_model is not None:
            with clock.phase("ref_logprobs"), self.models.reference_weights():
                ref_logp = batch_logprobs(
                    self.models.ref_model,
                    batch,
                    self.temperature,
                    self._row_batches(batch, torch.arange(len(batch.generations))),
                    packed=self.models.packing,
                    chunk_size=chunk,
                )[0]
        return PolicyPasses(old_logp, ref_logp, sampling_entropy, plan.first_forward_rows)

    def _epochs(
        self,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        passes: PolicyPasses,
        first_order: torch.Tensor,
        step: int,
        clock: PhaseClock,
    ) -> UpdateResult:
        """PPO epochs over mini-batches (epoch 0 in ``first_order``), gradient accumulation over
        micro-batches, for rollout step ``step``. With several processes, each holds its share of
        every mini-batch, losses use the global token and sequence counts, and gradients are summed
        before the optimizer step."""
        total, size = len(batch.generations), self.mini_batch_size(batch)
        first = FirstForward(
            passes.first_forward_rows,
            passes.old_logp,
            passes.sampling_entropy,
            None if batch.has_sampling_entropy else batch.sequences.response_mask,
        )
        stats: dict[str, list[float]] = defaultdict(list)
        self.models.model.train()
        for epoch in range(self.settings.ppo_epochs):
            order = (
                first_order
                if epoch == 0
                else shuffled_rows(total, batch.group_size, self.models.packing, self.generator)
            )
            for start in range(0, total, size):
                with clock.phase("forward"):
                    mini = self._mini_batch(batch, advantages, order[start : start + size], first)
                entropy_sum = 0.0
                for positions in mini.plan:
                    with clock.phase("forward"):
                        loss, metrics, micro_entropy = self._micro_batch_loss(
                            batch, advantages, passes, mini, positions, first, self.bonus.current()
                        )
                    with clock.phase("backward"):
                        self.optim.scaler.scale(loss).backward()  # scaled for float16 compute only
                    self.faults.at("update", step)
                    entropy_sum += micro_entropy
                    for key, value in {"loss": loss.item(), **metrics}.items():
                        stats[key].append(value)
                with clock.phase("optimizer"):
                    grad_norm, applied = self.optim.step(stats["loss"][-len(mini.plan) :])
                stats["actor/grad_norm"].append(grad_norm)
                stats["actor/skipped_updates"].append(float(not applied))
                if self.bonus.enabled:
                    stats["actor/entropy_coeff"].append(self.bonus.current())
                if self.bonus.adaptive:  # the optimizer step's token-mean entropy over every process
                    self.bonus.observe(self.processes.sum(entropy_sum) / max(1, mini.num_tokens))
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        # this process's share of the loss; mean_metrics makes it the global loss over processes
        out["loss"] = float(np.sum(stats["loss"])) * self.processes.world / len(stats["actor/grad_norm"])
        out["actor/skipped_updates"] = float(np.sum(stats["actor/skipped_updates"]))
        return UpdateResult(out, first.entropy)

    def _mini_batch(
        self, batch: RolloutBatch, advantages: torch.Tensor, rows: torch.Tensor, first: FirstForward
    ) -> MiniBatch:
        """The rows of one optimizer step: their global token count, the loss's token selection over
        all of them (from rollout-time tensors), and their micro-batches."""
        num_tokens = int(self.processes.sum(batch.sequences.response_mask[rows].sum().item()))
        selection: dict[str, torch.Tensor] = {}
        if self.prepare_fn is not None:
            mask = batch.sequences.response_mask[rows].float()
            entropy = batch.sampling_entropy if first.entropy is None else first.entropy
            inputs = MiniBatchInputs(batch.rollout_logprobs[rows], entropy[rows], advantages[rows], mask)
            selection = self.prepare_fn(inputs, self.loss_config)
        return MiniBatch(rows, self.micro_batch_plan(batch, rows), selection, num_tokens)

    def _micro_batch_loss(
        self,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        passes: PolicyPasses,
        mini: MiniBatch,
        positions: torch.Tensor,
        first: FirstForward,
        entropy_coeff: float,
    ) -> tuple[torch.Tensor, dict[str, float], float]:
        """The loss of micro-batch ``mini.rows[positions]`` (forward with gradient, the entropy bonus
        at ``entropy_coeff``), its metrics and the sum of its token entropies; ``first`` takes the old
        log-probs and entropies of rows whose forward this is at the sampling weights."""
        idx, world = mini.rows[positions], self.processes.world
        with self.models.precision.autocast(self.models.model):
            logp, entropy, mask = rows_logprobs(
                self.models.model,
                batch,
                idx,
                self.temperature,
                with_entropy=True,
                packed=self.models.packing,
                chunk_size=self.settings.logits_chunk_size,
            )
        r, dev = mask.shape[1], logp.device
        old_logp = first.old_log_probs(idx, logp, entropy)
        inputs = PolicyLossInputs(
            logp=logp,
            old_logp=old_logp,
            advantages=advantages[idx, :r].to(dev),
            mask=mask,
            entropy=None if entropy is None else entropy.detach(),
            ref_logp=None if passes.ref_logp is None else passes.ref_logp[idx, :r].to(dev),
            selection={k: v[positions, :r].to(dev) for k, v in mini.selection.items()},
            generator=self.generator,
            num_tokens=mini.num_tokens,
            num_micro_batches=len(mini.plan) * world,
            rollout_logp=batch.rollout_logprobs[idx, :r].to(dev),
            entropy_coeff=entropy_coeff,
            bonus_entropy=entropy,
        )
        loss, loss_metrics, kl = micro_batch_loss(
            self.loss_fn, inputs, self.loss_config, len(mini.rows) * world
        )
        metrics = {} if kl is None else {"kl": kl.item()}
        metrics.update({f"actor/{k}": v.item() for k, v in loss_metrics.items()})
        entropy_sum = 0.0
        if entropy is not None:
            metrics["actor/entropy"] = masked_mean(entropy.detach(), mask).item()
            entropy_sum = float((entropy.detach() * mask).sum())
        return loss, metrics, entropy_sum
