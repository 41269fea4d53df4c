"""The RLVR training loop: rollout -> reward -> advantages -> update -> log.

Read it top to bottom: ``Trainer.train`` is the loop, each stage is one method. Methods differ
only through the registry (``semrl.algos.registry``): their rollout, advantage estimator and loss
defaults. Set-up lives in ``semrl.run_setup``, metrics in ``semrl.metrics``, run files in
``semrl.run_log``, DAPO's group filter in ``semrl.group_filter``.
"""

from __future__ import annotations

import logging
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

import semrl.checkpoint as checkpoints
import semrl.distributed as dist
import semrl.run_setup as setup
from semrl.algos.catalog import get_method, get_policy_loss
from semrl.algos.losses import masked_mean
from semrl.algos.policy_losses import MiniBatchInputs, PolicyLossInputs, micro_batch_loss
from semrl.algos.registry import AdvantageInputs, RolloutContext
from semrl.batch import RolloutBatch, gather_groups
from semrl.batch_forward import batch_logprobs, micro_batches, rows_logprobs, shuffled_rows
from semrl.config import Config
from semrl.curriculum import StageSchedule, stage_reference_dir
from semrl.data import EpochSampler, build_prompt_ids, problem_columns
from semrl.distributed import ProcessGroup, full_state_dict
from semrl.errors import Preempted, TrainingError
from semrl.evaluation import evaluate_splits
from semrl.faults import kill_point
from semrl.group_filter import choose_groups, split_groups
from semrl.metrics import entropy_metrics, reward_metrics, rollout_metrics
from semrl.models import load_model, resolve_model_path
from semrl.optim import guarded_step, make_optimizer
from semrl.preemption import StopSignal
from semrl.reward import VerifierPool, reward_functions
from semrl.reward.shaping import overlong_penalty
from semrl.rollout import GenerationRequest, sampling_params, sequence_seed
from semrl.run_log import RunLog

logger = logging.getLogger(__name__)


class Trainer:
    def __init__(self, cfg: Config, resume: bool = False, reward_callables: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.method = get_method(cfg.algorithm.method)
        self.policy_loss = get_policy_loss(cfg.algorithm.policy_loss)  # type: ignore[arg-type]
        # reward_callables: functions of reward.functions run in this process (semrl.train's own)
        self.rewards = reward_functions(cfg.reward.functions, cfg.reward.weights, reward_callables)
        self.method_state = self.method.new_state() if self.method.new_state else None
        self.run_dir = Path(cfg.logging.output_dir)
        self.procs = ProcessGroup()
        setup.check_world_size(cfg, self.procs.world)
        ckpt = setup.prepare_run_dir(cfg, resume, self.procs)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        # one random stream per process (the data order is shared by all)
        self.generator = setup.seed_everything(cfg.trainer.seed + self.procs.rank)
        self.eval_problems, self.stages = setup.load_problem_sets(cfg)  # data first: fails before a model loads
        transfer = setup.load_transfer_problems(cfg, [self.eval_problems, *self.stages])
        self.eval_sets = {name: ps for name, ps in (("eval", self.eval_problems), ("transfer", transfer)) if ps}
        self.log = RunLog(self.run_dir, self.procs.is_main, partial(setup.start_trackers, cfg))  # before the models too
        self.schedule = StageSchedule.even(len(self.stages), cfg.trainer.steps)
        self._enter_stage(0)

        with self.procs.state.main_process_first():  # one process converts a GGUF into the cache
            model_path = str(ckpt) if ckpt else resolve_model_path(cfg.model.name, cfg.model.cache_dir)
        needs_reference = cfg.algorithm.kl_coef > 0 or cfg.logging.log_ref_kl or self.policy_loss.needs_reference(cfg)
        models = setup.load_models(cfg, model_path, self.procs, needs_reference)
        self.tokenizer, self.model, self.engine = models.tokenizer, models.model, models.engine
        self.rollout_model, self.ref_model, self.reference_weights = models.rollout_model, models.ref_model, models.reference_weights
        setup.check_prompt_lengths(self.tokenizer, [p for ps in [*self.stages, transfer] for p in ps], cfg)
        self.packing = setup.packing_enabled(cfg, self.model)
        self._micro_batches = partial(  # (batch, rows) -> positions into rows of each micro-batch
            micro_batches, size=cfg.trainer.micro_batch_size, token_budget=cfg.trainer.micro_batch_tokens,
            packed=self.packing, agree=lambda n: max(self.procs.gather(n)),  # as many on every process
        )
        self.precision = models.precision
        self.scaler = self.precision.grad_scaler(self.procs.device)  # float16 compute only
        self.pool = VerifierPool(cfg.reward.num_workers, cfg.reward.timeout_s, self.rewards.pool_functions)
        # with a curriculum that restarts each stage, the schedule spans one stage
        reset = cfg.data.curriculum_reset_optimizer
        self.optimizer, self.scheduler = make_optimizer(self.model, cfg, self.schedule.steps_of(0) if reset else cfg.trainer.steps)
        self.step, self.consecutive_bad_updates = 0, 0
        if ckpt is not None:
            self._restore(ckpt)

    # ------------------------------------------------------------------------------------------
    # Stages of the curriculum, checkpoints

    def _enter_stage(self, stage: int) -> None:
        self.stage = stage
        self.train_problems = self.stages[stage]
        self.sampler = EpochSampler(len(self.train_problems), self.cfg.trainer.seed + stage)

    def _advance_stage(self) -> None:
        """Curriculum: move to the next stage once this one's steps are done. With
        ``data.curriculum_reset_optimizer`` the new stage starts like a run from the previous
        stage's final checkpoint: fresh optimizer and schedule, and those weights as reference."""
        if not self.schedule.advances_at(self.stage, self.step):
            return
        self.save()
        self._enter_stage(self.stage + 1)
        logger.info("curriculum: stage %d of %d from step %d", self.stage + 1, len(self.stages), self.step)
        if self.cfg.data.curriculum_reset_optimizer:
            self.optimizer, self.scheduler = make_optimizer(self.model, self.cfg, self.schedule.ends[self.stage] - self.step)
            if self.ref_model is not None:
                weights = self._full_weights()
                if weights is None:
                    self.ref_model.load_state_dict(self.rollout_model.state_dict())
                else:
                    dist.load_full_state_dict(self.ref_model, weights)
                if self.procs.is_main:
                    checkpoints.save_checkpoint(
                        stage_reference_dir(self.run_dir, self.stage), self.step, self.rollout_model, self.tokenizer,
                        {}, 1, model_state=weights,
                    )
                self.procs.barrier()

    def _restore(self, ckpt: Path) -> None:
        state = checkpoints.load_trainer_state(ckpt)
        self._enter_stage(state.get("stage", 0))
        if self.stage > 0 and self.cfg.data.curriculum_reset_optimizer:
            self.optimizer, self.scheduler = make_optimizer(self.model, self.cfg, self.schedule.steps_of(self.stage))
            reference = checkpoints.latest_checkpoint(stage_reference_dir(self.run_dir, self.stage))
            if self.ref_model is not None and reference is not None:
                self.ref_model.load_state_dict(load_model(str(reference), self.cfg.model.dtype).state_dict())
        if self.cfg.trainer.fsdp:
            dist.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        self.sampler.load_state_dict(state["sampler"])
        checkpoints.set_rng_state(checkpoints.process_rng_state(state, ckpt, self.procs.rank, self.procs.world), self.generator)
        self.step = state["step"]
        self.consecutive_bad_updates = state.get("consecutive_bad_updates", 0)
        self.log.truncate_after(self.step)
        logger.info("resumed from %s at step %d", ckpt, self.step)

    def _full_weights(self) -> dict[str, torch.Tensor] | None:
        """The trained weights whole (a collective under FSDP: the hf engine's full copy may hold
        them in the lower compute dtype); None where ``rollout_model`` is the trained model."""
        return full_state_dict(self.model) if self.cfg.trainer.fsdp else None

    def save(self) -> Path:
        """Checkpoint written by the main process (every process holds the same weights)."""
        rngs = self.procs.gather(checkpoints.rng_state(self.generator))
        fsdp = self.cfg.trainer.fsdp
        state = {
            "step": self.step,
            "optimizer": dist.full_optimizer_state(self.model, self.optimizer) if fsdp else self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": rngs if self.procs.distributed else rngs[0],
            "consecutive_bad_updates": self.consecutive_bad_updates,
            "grad_scaler": self.scaler.state_dict(),
            "stage": self.stage,
            "config": self.cfg.to_dict(),
        }
        path = checkpoints.checkpoint_dir(self.run_dir, self.step)
        weights = self._full_weights()
        if self.procs.is_main:
            path = checkpoints.save_checkpoint(
                self.run_dir, self.step, self.rollout_model, self.tokenizer, state, self.cfg.logging.keep_last,
                model_state=weights,
            )
        self.procs.barrier()
        return path

    # ------------------------------------------------------------------------------------------
    # The loop

    def train(self) -> dict[str, float]:
        cfg = self.cfg
        if self.step == 0 and self.eval_sets:
            self.log.metrics({"step": 0, **self.evaluate()})
        bar = tqdm(
            total=cfg.trainer.steps, initial=self.step, desc="train",
            disable=not (cfg.logging.progress and self.procs.is_main), dynamic_ncols=True,
        )
        last: dict[str, float] = {}
        stop = StopSignal().install()  # SIGTERM / SIGINT: finish this step, checkpoint, exit
        try:
            while self.step < cfg.trainer.steps:
                self._advance_stage()
                t0 = time.perf_counter()
                batch, step_reward_metrics, t_reward = self.collect()
                t1 = time.perf_counter()
                advantages, advantage_metrics = self.advantages(batch)
                update_metrics = self.update(batch, advantages)
                # the next rollout samples the new weights: FSDP gathers them for the engine's copy,
                # vllm takes them in place (a no-op for hf, which samples from the trained model)
                self.engine.sync_weights(full_state_dict(self.model) if cfg.trainer.fsdp else None)
                t3 = time.perf_counter()
                self.step += 1
                last = {
                    "step": self.step,
                    **step_reward_metrics,
                    **rollout_metrics(batch),
                    **entropy_metrics(batch, advantages, cfg.logging.low_entropy_threshold),
                    **batch.metrics,
                    **advantage_metrics,
                    **update_metrics,
                    "lr": self.scheduler.get_last_lr()[0],
                    "curriculum/stage": float(self.stage + 1),
                    "time/rollout_s": t1 - t0 - t_reward,
                    "time/reward_s": t_reward,
                    "time/update_s": t3 - t1,
                    "time/step_s": t3 - t0,
                }
                last = self.procs.mean_metrics(last)
                every = cfg.logging.eval_every
                if self.eval_sets and (self.step == cfg.trainer.steps or (every and self.step % every == 0)):
                    last.update(self.evaluate())
                self.log.metrics(last)
                self.log.samples(
                    batch, advantages, self.step, self.tokenizer, cfg.logging.samples_per_step,
                    cfg.logging.trees_per_step, cfg.rose.code_compat,
                )
                saved = None
                if (cfg.logging.save_every and self.step % cfg.logging.save_every == 0) or self.step == cfg.trainer.steps:
                    saved = self.save()
                self._stop_if_needed(saved, stop)
                bar.update(1)
                bar.set_postfix(
                    reward=f"{last['reward']:.3f}", acc=f"{last['accuracy']:.3f}", entropy=f"{last['entropy']:.2f}",
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
        limit = self.cfg.trainer.max_bad_updates
        if limit > 0 and self.consecutive_bad_updates >= limit:
            raise TrainingError.bad_updates(self.consecutive_bad_updates, limit, self.step, saved or self.save(), self.run_dir)
        if self.step < self.cfg.trainer.steps and not self.procs.all_true(stop.received is None):
            name = signal.Signals(stop.received).name if stop.received else "a stop signal (another process)"
            raise Preempted(name, self.step, saved or self.save(), self.run_dir)

    # ------------------------------------------------------------------------------------------
    # Stages

    def collect(self) -> tuple[RolloutBatch, dict[str, float], float]:
        """Rollout + reward. With ``algorithm.dynamic_sampling`` (DAPO), groups whose rewards are all
        equal are dropped and more prompts are sampled until ``prompts_per_step`` groups remain, for at
        most ``algorithm.max_sampling_rounds`` rollout batches; a batch still short is filled with
        dropped groups, whose advantages are zero. Returns (batch, reward metrics over every sampled
        sequence, seconds spent in the reward stage). With several processes each one keeps its share
        of the groups, and all of them sample until every share is full."""
        algo, wanted = self.cfg.algorithm, self.cfg.rollout.prompts_per_step // self.procs.world
        sampled: list[RolloutBatch] = []
        kept, dropped = [], []
        reward_seconds = 0.0
        while True:
            batch = self.rollout(len(sampled))
            t0 = time.perf_counter()
            self.reward(batch)
            reward_seconds += time.perf_counter() - t0
            sampled.append(batch)
            if not algo.dynamic_sampling:
                return batch, reward_metrics(sampled), reward_seconds
            more_kept, more_dropped = split_groups(batch, algo.dynamic_sampling_metric)
            kept, dropped = kept + more_kept, dropped + more_dropped
            if self.procs.all_true(len(kept) >= wanted) or len(sampled) >= algo.max_sampling_rounds:
                break
        if len(kept) < wanted:
            logger.warning(
                "dynamic sampling: %d of %d groups have distinct rewards after %d rollout batches "
                "(algorithm.max_sampling_rounds); filling with zero-advantage groups", len(kept), wanted, len(sampled),
            )
        metrics = reward_metrics(sampled)
        metrics["dynamic_sampling/rollout_batches"] = float(len(sampled))
        metrics["dynamic_sampling/kept_groups"] = self.procs.sum(min(len(kept), wanted))
        metrics["dynamic_sampling/filled_groups"] = self.procs.sum(max(0, wanted - len(kept)))
        return gather_groups(choose_groups(kept, dropped, wanted)), metrics, reward_seconds

    def rollout(self, round_index: int = 0) -> RolloutBatch:
        """G samples for each prompt of this process's share of the step's global batch."""
        cfg = self.cfg
        group = cfg.rollout.group_size
        global_batch = self.sampler.next_indices(cfg.rollout.prompts_per_step)  # the same on every process
        share = self.procs.share(len(global_batch))  # positions in the global batch
        problems = [self.train_problems[global_batch[k]] for k in share]
        prompt_ids = [build_prompt_ids(self.tokenizer, p.problem, cfg.data.system_prompt, cfg.data.prompt_template) for p in problems]
        params = sampling_params(cfg.rollout)
        if self.method.rollout_fn is not None:
            context = RolloutContext(self.engine, params, self.generator, cfg, self.method_state)
            out = self.method.rollout_fn(context, prompt_ids)
            gens, groups, metrics, sequence_prompts = out.generations, out.groups, out.metrics, out.sequence_prompt_ids
        else:
            seeded = cfg.rollout.seed_per_sequence  # k: the prompt's index in the global batch
            requests = [
                GenerationRequest(ids, seed=sequence_seed(cfg.trainer.seed, self.step, round_index, k, j) if seeded else None)
                for k, ids in zip(share, prompt_ids, strict=True) for j in range(group)
            ]
            gens, groups, metrics, sequence_prompts = self.engine.generate(requests, params, self.generator), None, {}, None
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

    def reward(self, batch: RolloutBatch) -> None:
        """Score every response; fills ``batch.rewards`` and ``batch.reward_results``."""
        rc, timeouts_before = self.cfg.reward, self.pool.num_timeouts
        batch.reward_results, batch.reward_function_sums = self.rewards.score(
            self.pool, [p.problem for p in batch.problems], batch.texts, [g.token_ids.tolist() for g in batch.generations],
            [problem_columns(p) for p in batch.problems], final_number_fallback=rc.final_number_fallback,
            truncated=[g.truncated for g in batch.generations], truncated_reward=rc.truncated_reward,
        )
        batch.rewards = torch.tensor([r.reward for r in batch.reward_results])
        if rc.overlong_buffer_len > 0:
            lengths = torch.tensor([len(g.token_ids) for g in batch.generations])
            batch.rewards += overlong_penalty(
                lengths, self.cfg.rollout.max_new_tokens, rc.overlong_buffer_len, rc.overlong_penalty_factor
            )
        batch.verify_timeouts = self.pool.num_timeouts - timeouts_before

    def advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """(N, T) advantages from the method's estimator, and its metrics."""
        assert batch.rewards is not None
        inputs = AdvantageInputs(
            batch.rewards, batch.group_ids, batch.sequences.response_mask, batch.groups,
            answers=[r.answer for r in batch.reward_results], correct=[r.correct for r in batch.reward_results],
            logprobs=batch.rollout_logprobs,
        )
        return self.method.advantage_fn(inputs, self.cfg)

    def update(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """PPO epochs over mini-batches, gradient accumulation over micro-batches. With several
        processes, each holds its share of every mini-batch, losses use the global token and
        sequence counts, and gradients are summed before the optimizer step."""
        cfg = self.cfg
        seqs = batch.sequences
        total = seqs.input_ids.shape[0]
        world = self.procs.world
        mini = (cfg.trainer.mini_batch_size // world) if cfg.trainer.mini_batch_size else total
        chunk = cfg.trainer.logits_chunk_size
        temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
        # On-policy with a single update: pi_old = pi_theta, so the ratio is exactly 1 and the
        # extra forward pass for old log-probs is skipped.
        single_update = cfg.trainer.ppo_epochs == 1 and mini == total
        # An engine without entropies (vllm, docs/engines.md): they come from the trainer's forward at
        # the sampling weights, from the old-log-prob pass when there is one, else from a pass of their
        # own when a token selection needs them before the update, else from the update's forward.
        fill = not batch.has_rollout_entropy and (not single_update or self.policy_loss.prepare_fn is not None)
        old_logp = None
        every_row = self._micro_batches(batch, torch.arange(total)) if not single_update or fill or self.ref_model else []
        if not single_update or fill:
            with self.precision.autocast(self.model):
                logp_now, entropy_now = batch_logprobs(self.model, batch, temperature, every_row, self.packing, fill, chunk)
            old_logp = None if single_update else logp_now
            if entropy_now is not None:
                batch.set_rollout_entropy(entropy_now)
        update_entropy = None if batch.has_rollout_entropy else torch.zeros(seqs.response_mask.shape)
        with self.reference_weights():  # under LoRA: the trained model with its adapters off
            ref_logp = batch_logprobs(self.ref_model, batch, temperature, every_row, self.packing, False, chunk)[0] if self.ref_model else None

        self.model.train()
        stats: dict[str, list[float]] = {}
        skipped = 0
        for _ in range(cfg.trainer.ppo_epochs):
            order = shuffled_rows(total, batch.group_size, self.packing, self.generator)
            for m_start in range(0, total, mini):
                mini_idx = order[m_start : m_start + mini]
                num_tokens = int(self.procs.sum(seqs.response_mask[mini_idx].sum().item()))
                selection: dict[str, torch.Tensor] = {}
                if self.policy_loss.prepare_fn is not None:  # token selection over the whole mini-batch
                    selection = self.policy_loss.prepare_fn(
                        MiniBatchInputs(
                            batch.rollout_logprobs[mini_idx], batch.rollout_entropy[mini_idx],
                            advantages[mini_idx], seqs.response_mask[mini_idx].float(),
                        ),
                        cfg,
                    )
                plan = self._micro_batches(batch, mini_idx)
                n_micro = len(plan)
                for positions in plan:
                    idx = mini_idx[positions]
                    with self.precision.autocast(self.model):
                        logp, entropy, mask = rows_logprobs(self.model, batch, idx, temperature, True, self.packing, chunk)
                    r, dev = mask.shape[1], logp.device
                    if update_entropy is not None and entropy is not None:
                        update_entropy[idx, :r] = entropy.detach().float().cpu()
                    inputs = PolicyLossInputs(
                        logp=logp, old_logp=logp.detach() if old_logp is None else old_logp[idx, :r].to(dev),
                        advantages=advantages[idx, :r].to(dev), mask=mask,
                        entropy=None if entropy is None else entropy.detach(),
                        ref_logp=None if ref_logp is None else ref_logp[idx, :r].to(dev),
                        selection={k: v[positions, :r].to(dev) for k, v in selection.items()},
                        generator=self.generator, num_tokens=num_tokens, num_micro_batches=n_micro * world,
                    )
                    loss, pg_metrics, kl = micro_batch_loss(self.policy_loss, inputs, cfg, len(mini_idx) * world)
                    if kl is not None:
                        stats.setdefault("kl", []).append(kl.item())
                    self.scaler.scale(loss).backward()  # scaled for float16 compute only
                    kill_point("update", self.step + 1)
                    stats.setdefault("loss", []).append(loss.item())
                    for k, v in pg_metrics.items():
                        stats.setdefault(f"actor/{k}", []).append(v.item())
                    if entropy is not None:
                        stats.setdefault("actor/entropy", []).append(masked_mean(entropy, mask).item())
                grad_norm, applied = guarded_step(  # FSDP reduce-scatters the gradients during backward
                    self.model, self.optimizer, self.scheduler, self.procs, cfg.trainer.max_grad_norm,
                    not cfg.trainer.fsdp, stats["loss"][-n_micro:], self.scaler,
                )
                skipped += not applied
                self.consecutive_bad_updates = 0 if applied else self.consecutive_bad_updates + 1
                stats.setdefault("actor/grad_norm", []).append(grad_norm)
            if update_entropy is not None:  # single update: the first forward ran at the sampling weights
                batch.set_rollout_entropy(update_entropy)
                update_entropy = None
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        # this process's share of the loss; mean_metrics makes it the global loss over processes
        out["loss"] = float(np.sum(stats["loss"])) * world / (cfg.trainer.ppo_epochs * (total // mini))
        out["actor/skipped_updates"] = float(skipped)
        return out

    def evaluate(self) -> dict[str, float]:
        """mean@k / pass@k on the held-out problems and the transfer split (``eval/`` and
        ``transfer/`` metrics on the main process; problem records in ``RUN_DIR/eval``)."""
        kill_point("evaluate", self.step)
        return evaluate_splits(self.engine, self.tokenizer, self.pool, self.eval_sets, self.cfg, self.procs, self.step, self.run_dir)
