"""The RLVR training loop: rollout -> reward -> advantages -> update -> log.

Read it top to bottom: ``Trainer.train`` is the loop, each stage is one method. Methods differ
only through the registry (``semrl.algos.registry``): their rollout, advantage estimator, loss and
options; nothing here names one. Set-up lives in ``semrl.run_setup``, checkpoints and a
curriculum's stage change in ``semrl.checkpoint``, the curriculum in ``semrl.curriculum``, the
optimizer step in ``semrl.optim``, the no-gradient forwards in ``semrl.batch_forward``, metrics
in ``semrl.metrics``, run files in ``semrl.run_log``, DAPO's group filter in ``semrl.group_filter``.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

import semrl.run_setup as setup
from semrl.algos.catalog import get_method, get_policy_loss
from semrl.algos.entropy_bonus import EntropyBonus
from semrl.algos.losses import masked_mean
from semrl.algos.policy_losses import MiniBatchInputs, PolicyLossInputs, micro_batch_loss
from semrl.algos.registry import AdvantageInputs, RolloutContext, method_config
from semrl.batch import Collected, RolloutBatch
from semrl.batch_forward import (
    FirstForward,
    MiniBatch,
    PolicyPasses,
    UpdateResult,
    fill_sampling_entropy,
    micro_batches,
    policy_passes,
    rows_logprobs,
    shuffled_rows,
)
from semrl.checkpoint import RunState, advance_stage, load_stage_reference, restore_run, save_run
from semrl.config import Config
from semrl.curriculum import Curriculum
from semrl.data import build_prompt_ids
from semrl.distributed import ProcessGroup, iter_full_parameters
from semrl.engines import GenerationRequest, sampling_params, sequence_seed
from semrl.errors import Preempted, TrainingError
from semrl.evaluation import evaluate_splits
from semrl.faults import kill_point
from semrl.group_filter import GroupFilter
from semrl.metrics import entropy_metrics, rollout_metrics
from semrl.models import resolve_model_path
from semrl.optim import Optimization
from semrl.preemption import StopSignal
from semrl.reward import Scores, VerifierPool, reward_functions, score
from semrl.run_log import RunLog

logger = logging.getLogger(__name__)


class Trainer:
    def __init__(
        self, cfg: Config, resume: bool = False, reward_callables: dict[str, Any] | None = None,
        reuse_first_forward: bool = True,
    ) -> None:
        self.cfg = cfg
        # the update's first mini-batch reuses the forward that gave its old log-probs (exact: it runs
        # before any optimizer step); False runs it again, for the tests and benchmark that compare
        self.reuse_first_forward = reuse_first_forward
        self.method = get_method(cfg.algorithm.method)
        self.policy_loss = get_policy_loss(cfg.algorithm.policy_loss)  # type: ignore[arg-type]
        self.method_config = method_config(cfg, self.method.section)
        self.loss_config = method_config(cfg, self.policy_loss.section)
        # reward_callables: functions of reward.functions run in this process (semrl.train's own)
        self.rewards = reward_functions(
            cfg.reward.functions, cfg.reward.weights, reward_callables, cfg.reward.correctness
        )
        self.method_state = self.method.new_state() if self.method.new_state else None
        self.run_dir = Path(cfg.logging.output_dir)
        self.procs = ProcessGroup()
        setup.check_world_size(cfg, self.procs.world)
        ckpt = setup.prepare_run_dir(cfg, resume, self.procs)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        # one random stream per process (the data order is shared by all)
        self.generator = setup.seed_everything(cfg.trainer.seed + self.procs.rank)
        eval_problems, stages = setup.load_problem_sets(cfg)  # data first: fails before a model loads
        transfer = setup.load_transfer_problems(cfg, [eval_problems, *stages])
        self.eval_sets = {name: ps for name, ps in (("eval", eval_problems), ("transfer", transfer)) if ps}
        # before the models too
        self.log = RunLog(self.run_dir, self.procs.is_main, partial(setup.start_trackers, cfg))
        self.curriculum = Curriculum(stages, cfg.trainer.steps, cfg.trainer.seed)

        with self.procs.state.main_process_first():  # one process converts a GGUF into the cache
            model_path = str(ckpt) if ckpt else resolve_model_path(cfg.model.name, cfg.model.cache_dir)
        needs_ref = cfg.algorithm.kl_coef > 0 or cfg.logging.log_ref_kl or self.policy_loss.needs_reference(
            self.loss_config.options
        )
        models = setup.load_models(cfg, model_path, self.procs, needs_ref)
        self.tokenizer, self.model, self.engine = models.tokenizer, models.model, models.engine
        self.rollout_model, self.ref_model = models.rollout_model, models.ref_model
        self.reference_weights = models.reference_weights
        setup.check_prompt_lengths(self.tokenizer, [p for ps in [*stages, transfer] for p in ps], cfg)
        self.packing = setup.packing_enabled(cfg, self.model)
        self._micro_batches = partial(  # (batch, rows) -> positions into rows of each micro-batch
            micro_batches, size=cfg.trainer.micro_batch_size, token_budget=cfg.trainer.micro_batch_tokens,
            packed=self.packing, agree=lambda n: max(self.procs.gather(n)),  # as many on every process
        )
        self.precision = models.precision
        self.pool = VerifierPool(cfg.reward.num_workers, cfg.reward.timeout_s, self.rewards.pool_functions)
        # with a curriculum that restarts each stage, the schedule spans one stage
        reset = cfg.data.curriculum_reset_optimizer
        schedule_steps = self.curriculum.schedule.steps_of(0) if reset else cfg.trainer.steps
        optim = Optimization(
            self.model, cfg, self.procs, schedule_steps, self.precision.grad_scaler(self.procs.device)
        )
        bonus = EntropyBonus.from_config(cfg.algorithm)
        self.run = RunState(0, self.curriculum, optim, self.generator, bonus)
        if ckpt is not None:
            restore_run(ckpt, self.run, self.model, cfg, self.procs)
            if self.curriculum.stage > 0 and reset and self.ref_model is not None:
                load_stage_reference(self.run_dir, self.curriculum.stage, self.ref_model, cfg.model.dtype)
            self.log.truncate_after(self.run.step)
            logger.info("resumed from %s at step %d", ckpt, self.run.step)

    @property
    def step(self) -> int:
        return self.run.step

    def save(self) -> Path:
        return save_run(
            self.run_dir, self.run, self.model, self.rollout_model, self.tokenizer, self.cfg, self.procs
        )

    # ------------------------------------------------------------------------------------------
    # The loop

    def train(self) -> dict[str, float]:
        cfg, run = self.cfg, self.run
        if run.step == 0 and self.eval_sets and cfg.logging.eval_base:
            self.log.metrics({"step": 0, **self.evaluate()})
        bar = tqdm(
            total=cfg.trainer.steps, initial=run.step, desc="train",
            disable=not (cfg.logging.progress and self.procs.is_main), dynamic_ncols=True,
        )
        last: dict[str, float] = {}
        stop = StopSignal().install()  # SIGTERM / SIGINT: finish this step, checkpoint, exit
        try:
            while run.step < cfg.trainer.steps:
                if self.curriculum.advances(run.step):  # checkpoint, next stage (and its reference)
                    advance_stage(
                        self.run_dir, run, self.model, self.rollout_model, self.ref_model, self.tokenizer,
                        cfg, self.procs,
                    )
                t0 = time.perf_counter()
                collected = self.collect()
                batch, scores = collected.batch, collected.scores
                self.engine.release_memory()  # vllm sleep mode: the update gets the engine's memory
                t1 = time.perf_counter()
                # epoch 0's row order, drawn first: the passes leave its first mini-batch to the update
                order = shuffled_rows(len(batch.generations), batch.group_size, self.packing, self.generator)
                passes = self.policy_passes(batch, order[: self._mini_batch_size(batch)])
                advantages, advantage_metrics = self.advantages(batch, scores)
                update = self.update(batch, advantages, passes, order)
                if update.sampling_entropy is not None:  # the engine gave none (vllm): the trainer's
                    batch.set_sampling_entropy(update.sampling_entropy)  # forwards measured it
                # the next rollout samples the new weights: FSDP gathers them for the engine's copy,
                # vllm takes them in place (a no-op for hf, which samples from the trained model)
                self.engine.sync_weights(iter_full_parameters(self.model) if cfg.trainer.fsdp else None)
                t3 = time.perf_counter()
                run.step += 1
                last = {
                    "step": run.step,
                    **collected.metrics,
                    **rollout_metrics(batch, scores),
                    **entropy_metrics(batch, advantages, cfg.logging.low_entropy_threshold),
                    **batch.metrics,
                    **advantage_metrics,
                    **update.metrics,
                    "lr": run.optim.lr,
                    "curriculum/stage": float(self.curriculum.stage + 1),
                    "time/rollout_s": collected.rollout_s,
                    "time/reward_s": collected.reward_s,
                    "time/update_s": t3 - t1,
                    "time/step_s": t3 - t0,
                }
                last = self.procs.mean_metrics(last)
                every = cfg.logging.eval_every
                if self.eval_sets and (run.step == cfg.trainer.steps or (every and run.step % every == 0)):
                    last.update(self.evaluate())
                self.log.metrics(last)
                self.log.samples(
                    batch, scores, advantages, run.step, self.tokenizer, cfg.logging.samples_per_step,
                    cfg.logging.trees_per_step
                )
                saved, save_every = None, cfg.logging.save_every
                if (save_every and run.step % save_every == 0) or run.step == cfg.trainer.steps:
                    saved = self.save()
                self._stop_if_needed(saved, stop)
                bar.update(1)
                bar.set_postfix(
                    reward=f"{last['reward']:.3f}", acc=f"{last['accuracy']:.3f}",
                    entropy=f"{last['entropy']:.2f}",
                    len=f"{last['response_length']:.0f}", s_per_step=f"{last['time/step_s']:.1f}",
                )
        finally:
            stop.uninstall()
            bar.close()
            self.pool.close()
            self.log.close()
        self.procs.barrier()
        return last

    def _stop_if_needed(self, saved: Path | None, stop: StopSignal) -> None:
        """Stop with a checkpoint (``saved``, this step's, or a new one) after too many bad updates,
        or before the next step when any process received a stop signal."""
        limit, bad = self.cfg.trainer.max_bad_updates, self.run.optim.consecutive_bad_updates
        if limit > 0 and bad >= limit:
            raise TrainingError.bad_updates(bad, limit, self.step, saved or self.save(), self.run_dir)
        if self.step < self.cfg.trainer.steps and not self.procs.all_true(stop.received is None):
            name = signal.Signals(stop.received).name if stop.received else "a stop signal (another process)"
            raise Preempted(name, self.step, saved or self.save(), self.run_dir)

    # ------------------------------------------------------------------------------------------
    # Stages of a step

    def collect(self) -> Collected:
        """Rollout + reward, in rounds while DAPO's dynamic sampling wants more informative groups
        (``semrl.group_filter.GroupFilter``)."""
        wanted = self.cfg.rollout.prompts_per_step // self.procs.world
        groups = GroupFilter(wanted, self.cfg.algorithm, self.procs)
        tokens_before, rollout_s, reward_s = self.engine.generated_tokens, 0.0, 0.0
        while not groups.full:
            t0 = time.perf_counter()
            batch = self.rollout(groups.rounds)
            t1 = time.perf_counter()
            groups.add(batch, self.reward(batch))
            rollout_s, reward_s = rollout_s + t1 - t0, reward_s + time.perf_counter() - t1
        batch, scores, metrics = groups.result()
        # the compute axis of `semrl compare`: every token sampled this step (dropped groups and tree
        # branches included, shared prefixes once), summed over processes (docs/results.md)
        metrics["rollout/sampled_tokens"] = self.procs.sum(self.engine.generated_tokens - tokens_before)
        return Collected(batch, scores, metrics, rollout_s, reward_s)

    def rollout(self, round_index: int = 0) -> RolloutBatch:
        """G samples for each prompt of this process's share of the step's global batch."""
        cfg, group = self.cfg, self.cfg.rollout.group_size
        # the same on every process
        global_batch = self.curriculum.sampler.next_indices(cfg.rollout.prompts_per_step)
        share = self.procs.share(len(global_batch))  # positions in the global batch
        problems = [self.curriculum.problems[global_batch[k]] for k in share]
        prompt_ids = [
            build_prompt_ids(self.tokenizer, p.problem, cfg.data.system_prompt, cfg.data.prompt_template)
            for p in problems
        ]
        params = sampling_params(cfg.rollout, top_logprobs=self.method.reads_top_logprobs)
        if self.method.rollout_fn is not None:
            entropy = partial(  # at the weights that sampled, in the engine's dtype
                fill_sampling_entropy, self.rollout_model, temperature=params.temperature,
                compute_dtype=self.engine.compute_dtype,
            )
            context = RolloutContext(
                self.engine, params, self.generator, self.method_config, entropy, self.method_state,
                decode=partial(self.tokenizer.decode, skip_special_tokens=True), step=self.step,
            )
            out = self.method.rollout_fn(context, prompt_ids)
            gens, groups, metrics = out.generations, out.groups, out.metrics
            sequence_prompts = out.sequence_prompt_ids
        else:
            seeded = cfg.rollout.seed_per_sequence  # k: the prompt's index in the global batch
            requests = [
                GenerationRequest(
                    ids,
                    seed=sequence_seed(cfg.trainer.seed, self.step, round_index, k, j) if seeded else None
                )
                for k, ids in zip(share, prompt_ids, strict=True) for j in range(group)
            ]
            gens = self.engine.generate(requests, params, self.generator)
            groups, metrics, sequence_prompts = None, {}, None
        kill_point("rollout", self.step + 1)
        return RolloutBatch(
            problems=[p for p in problems for _ in range(group)],
            prompt_ids=sequence_prompts or [ids for ids in prompt_ids for _ in range(group)],
            generations=gens,
            texts=[self.tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in gens],
            group_size=group,
            pad_token_id=self.tokenizer.pad_token_id,
            groups=groups or [],
            metrics=metrics,
        )

    def reward(self, batch: RolloutBatch) -> Scores:
        """Every response's score (``semrl.reward.score``)."""
        cfg = self.cfg
        return score(
            batch.problems, batch.texts, batch.generations, self.rewards, self.pool, cfg.reward,
            cfg.rollout.max_new_tokens,
        )

    def policy_passes(self, batch: RolloutBatch, first_mini_batch: torch.Tensor) -> PolicyPasses:
        """The no-gradient forwards before the update: old-policy and reference log-probs, and the
        rollout entropies an engine without them (vllm) leaves to the trainer (docs/engines.md).
        ``first_mini_batch``: the rows of the update's first optimizer step, whose old log-probs
        that step's forward gives."""
        t = self.cfg.trainer
        return policy_passes(
            self.model, self.ref_model, batch,
            lambda rows: [rows[p] for p in self._micro_batches(batch, rows)],
            temperature=self._temperature, packed=self.packing, chunk_size=t.logits_chunk_size,
            on_policy=t.ppo_epochs == 1 and self._mini_batch_size(batch) == len(batch.generations),
            sampling_entropy_before_update=self.policy_loss.prepare_fn is not None,
            autocast=lambda: self.precision.autocast(self.model), reference_weights=self.reference_weights,
            first_mini_batch=first_mini_batch if self.reuse_first_forward else None,
        )

    def advantages(self, batch: RolloutBatch, scores: Scores) -> tuple[torch.Tensor, dict[str, float]]:
        """(N, T) advantages from the method's estimator, and its metrics."""
        inputs = AdvantageInputs(
            scores.rewards, batch.group_ids, batch.sequences.response_mask, batch.groups,
            answers=[r.answer for r in scores.results], correct=[r.correct for r in scores.results],
            logprobs=batch.rollout_logprobs,
        )
        return self.method.advantage_fn(inputs, self.method_config)

    def update(
        self, batch: RolloutBatch, advantages: torch.Tensor, passes: PolicyPasses, first_order: torch.Tensor
    ) -> UpdateResult:
        """PPO epochs over mini-batches (epoch 0 in ``first_order``), gradient accumulation over
        micro-batches. With several processes, each holds its share of every mini-batch, losses use
        the global token and sequence counts, and gradients are summed before the optimizer step."""
        total, size = len(batch.generations), self._mini_batch_size(batch)
        first = FirstForward.plan(batch, passes)  # what forwards before the first optimizer step give
        stats: dict[str, list[float]] = defaultdict(list)
        self.model.train()
        for epoch in range(self.cfg.trainer.ppo_epochs):
            order = first_order if epoch == 0 else shuffled_rows(
                total, batch.group_size, self.packing, self.generator
            )
            for start in range(0, total, size):
                mini = self._mini_batch(batch, advantages, order[start : start + size], first)
                bonus, entropy_sum = self.run.entropy_bonus, 0.0
                for positions in mini.plan:
                    loss, metrics, micro_entropy = self._micro_batch_loss(
                        batch, advantages, passes, mini, positions, first, bonus.current()
                    )
                    self.run.optim.scaler.scale(loss).backward()  # scaled for float16 compute only
                    kill_point("update", self.step + 1)
                    entropy_sum += micro_entropy
                    for key, value in {"loss": loss.item(), **metrics}.items():
                        stats[key].append(value)
                grad_norm, applied = self.run.optim.step(stats["loss"][-len(mini.plan) :])
                stats["actor/grad_norm"].append(grad_norm)
                stats["actor/skipped_updates"].append(float(not applied))
                if bonus.enabled:
                    stats["actor/entropy_coeff"].append(bonus.current())
                if bonus.adaptive:  # the optimizer step's token-mean entropy over every process
                    bonus.observe(self.procs.sum(entropy_sum) / max(1, mini.num_tokens))
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        # this process's share of the loss; mean_metrics makes it the global loss over processes
        out["loss"] = float(np.sum(stats["loss"])) * self.procs.world / len(stats["actor/grad_norm"])
        out["actor/skipped_updates"] = float(np.sum(stats["actor/skipped_updates"]))
        return UpdateResult(out, first.entropy)

    def _mini_batch(
        self, batch: RolloutBatch, advantages: torch.Tensor, rows: torch.Tensor, first: FirstForward
    ) -> MiniBatch:
        """The rows of one optimizer step: their global token count, the loss's token selection over
        all of them (from rollout-time tensors), and their micro-batches."""
        num_tokens = int(self.procs.sum(batch.sequences.response_mask[rows].sum().item()))
        selection: dict[str, torch.Tensor] = {}
        if self.policy_loss.prepare_fn is not None:
            mask = batch.sequences.response_mask[rows].float()
            inputs = MiniBatchInputs(
                batch.rollout_logprobs[rows], first.sampling_entropy(batch)[rows], advantages[rows], mask
            )
            selection = self.policy_loss.prepare_fn(inputs, self.loss_config)
        return MiniBatch(rows, self._micro_batches(batch, rows), selection, num_tokens)

    def _micro_batch_loss(
        self, batch: RolloutBatch, advantages: torch.Tensor, passes: PolicyPasses, mini: MiniBatch,
        positions: torch.Tensor, first: FirstForward, entropy_coeff: float,
    ) -> tuple[torch.Tensor, dict[str, float], float]:
        """The loss of micro-batch ``mini.rows[positions]`` (forward with gradient, the entropy bonus
        at ``entropy_coeff``), its metrics and the sum of its token entropies; ``first`` takes the old
        log-probs and entropies of rows whose forward this is at the sampling weights."""
        idx, world = mini.rows[positions], self.procs.world
        with self.precision.autocast(self.model):
            logp, entropy, mask = rows_logprobs(
                self.model, batch, idx, self._temperature, with_entropy=True, packed=self.packing,
                chunk_size=self.cfg.trainer.logits_chunk_size,
            )
        r, dev = mask.shape[1], logp.device
        old_logp = first.old_log_probs(passes, idx, logp, entropy)
        inputs = PolicyLossInputs(
            logp=logp,
            old_logp=old_logp,
            advantages=advantages[idx, :r].to(dev), mask=mask,
            entropy=None if entropy is None else entropy.detach(),
            ref_logp=None if passes.ref_logp is None else passes.ref_logp[idx, :r].to(dev),
            selection={k: v[positions, :r].to(dev) for k, v in mini.selection.items()},
            generator=self.generator, num_tokens=mini.num_tokens, num_micro_batches=len(mini.plan) * world,
            rollout_logp=batch.rollout_logprobs[idx, :r].to(dev),
            entropy_coeff=entropy_coeff, bonus_entropy=entropy,
        )
        loss, loss_metrics, kl = micro_batch_loss(
            self.policy_loss, inputs, self.loss_config, len(mini.rows) * world
        )
        metrics = {} if kl is None else {"kl": kl.item()}
        metrics.update({f"actor/{k}": v.item() for k, v in loss_metrics.items()})
        entropy_sum = 0.0
        if entropy is not None:
            metrics["actor/entropy"] = masked_mean(entropy.detach(), mask).item()
            entropy_sum = float((entropy.detach() * mask).sum())
        return loss, metrics, entropy_sum

    def _mini_batch_size(self, batch: RolloutBatch) -> int:
        """This process's rows per optimizer step."""
        mini = self.cfg.trainer.mini_batch_size
        return mini // self.procs.world if mini else len(batch.generations)

    @property
    def _temperature(self) -> float:
        return self.cfg.rollout.temperature if self.cfg.rollout.temperature > 0 else 1.0

    def evaluate(self) -> dict[str, float]:
        """mean@k / pass@k on the held-out problems and the transfer split (``eval/`` and
        ``transfer/`` metrics on the main process; problem records in ``RUN_DIR/eval``)."""
        kill_point("evaluate", self.step)
        splits, first = self.eval_sets, self.cfg.logging.eval_base_problems
        if self.step == 0 and first is not None:  # the base model on a subset (logging.eval_base_problems)
            splits = {split: problems[:first] for split, problems in splits.items()}
        return evaluate_splits(
            self.engine, self.tokenizer, self.pool, splits, self.cfg, self.procs, self.step, self.run_dir,
            self.rewards,
        )
