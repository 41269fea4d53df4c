"""The RLVR training loop: rollout -> reward -> advantages -> update -> log.

Read it top to bottom: ``Trainer.train`` is the loop, each stage is one method. Methods differ
only through the registry (``semrl.methods.registry``): their rollout, advantage estimator, loss and
options; nothing here names one. Set-up lives in ``semrl.runtime.setup``, the run's state across
checkpoints and a curriculum's stage change in ``semrl.runtime.run_state`` (the files in
``semrl.runtime.checkpoint``), the curriculum in
``semrl.data.curriculum``, the optimizer step in ``semrl.update.optim``, the no-gradient forwards in
``semrl.update.row_logprobs``, metrics in ``semrl.tracking.metrics``, run files in
``semrl.tracking.run_log``, DAPO's group filter in ``semrl.rollout.group_filter``.
"""

from __future__ import annotations

import logging
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

import semrl.runtime.setup as setup
from semrl.config.sections import Config
from semrl.core.distributed import ProcessGroup, iter_full_parameters
from semrl.core.faults import Faults
from semrl.core.threads import torch_threads
from semrl.core.timing import PhaseClock, device_synchronize
from semrl.core.watchdog import phase
from semrl.data import PromptFormat
from semrl.data.curriculum import Curriculum
from semrl.data.problem_sets import run_problems
from semrl.errors import Preempted, TrainingError
from semrl.evaluation import evaluate_splits
from semrl.methods.catalog import get_method, get_policy_loss
from semrl.methods.entropy_bonus import EntropyBonus
from semrl.methods.interface import (
    AdvantageFn,
    AdvantageInputs,
    RolloutContext,
    RolloutFn,
    independent_rollout,
)
from semrl.methods.policy_loss import LossFn, PrepareFn
from semrl.methods.registry import MethodSpec, PolicyLoss, load, method_config
from semrl.models.loading import resolve_model_path
from semrl.reward import Scores, VerifierPool, reward_functions, score
from semrl.rollout.batch import CollectedStep, RolloutBatch
from semrl.rollout.engines import sampling_params
from semrl.rollout.group_filter import GroupFilter
from semrl.rollout.seeds import group_seeds, prompt_seed
from semrl.runtime.environment import RunEnvironment
from semrl.runtime.preemption import StopSignal
from semrl.runtime.run_state import RunState, advance_stage, load_stage_reference, restore_run, save_run
from semrl.tracking.metrics import cost_metrics, entropy_metrics, reward_metrics, rollout_metrics
from semrl.tracking.progress import Progress, step_line
from semrl.tracking.run_log import RunLog
from semrl.update.actor import Actor, ActorState, LoadedLoss, PolicyModels, UpdateResult
from semrl.update.optim import Optimization
from semrl.update.row_logprobs import with_sampling_entropy
from semrl.update.settings import UpdateConfig

logger = logging.getLogger(__name__)


def _seam_functions(
    cfg: Config, method: MethodSpec, policy_loss: PolicyLoss
) -> tuple[AdvantageFn, RolloutFn, LossFn, PrepareFn | None]:
    """The method's and the policy loss's tensor functions, imported now that training starts, each
    checked against the arguments the trainer passes it and typed as its seam."""
    name, loss = f"method {cfg.algorithm.method}'s", f"policy loss {cfg.algorithm.policy_loss}'s"
    advantage_fn: AdvantageFn = load(method.advantage_fn, ("inputs", "config"), f"{name} advantage_fn")
    rollout_fn: RolloutFn = (  # G independent samples per prompt for a method without its own
        load(method.rollout_fn, ("ctx", "prompt_ids"), f"{name} rollout_fn")
        if method.rollout_fn
        else independent_rollout
    )
    loss_fn: LossFn = load(policy_loss.loss_fn, ("inputs", "config"), f"{loss} loss_fn")
    prepare_fn: PrepareFn | None = (
        load(policy_loss.prepare_fn, ("mini_batch", "config"), f"{loss} prepare_fn")
        if policy_loss.prepare_fn
        else None
    )
    return advantage_fn, rollout_fn, loss_fn, prepare_fn


class Trainer:
    """One training run: its set-up (config checks, data, models, engine, optimizer, a checkpoint to
    resume from) in ``__init__``, then ``train``, the loop ``rollout -> reward -> advantages -> update ->
    log``, with evaluation, checkpoints and stop signals between steps (docs/architecture.md).

    Args:
        cfg: a loaded config (``semrl.config.load.load_config``).
        resume: continue the run in ``logging.output_dir`` from its last verified checkpoint.
        reward_callables: reward functions of ``reward.functions`` given as Python callables
            (``semrl.train``'s own), run in this process.
        reuse_first_forward: the update's first mini-batch takes its old log-probs from its own
            forward (``semrl.update.actor.Actor``); False runs a separate pass, for the tests and the
            benchmark that compare the two.
    """

    def __init__(
        self,
        cfg: Config,
        resume: bool = False,
        reward_callables: dict[str, Any] | None = None,
        reuse_first_forward: bool = True,
    ) -> None:
        self.cfg = cfg
        self.method = get_method(cfg.algorithm.method)
        self.policy_loss = get_policy_loss(cfg.algorithm.policy_loss)
        self.method_config = method_config(cfg, self.method.section)
        self.prompt = PromptFormat.of(cfg.data)  # how a problem becomes its prompt
        # the method's and the loss's tensor functions, imported now that training starts
        self.advantage_fn, self.rollout_fn, loss_fn, prepare_fn = _seam_functions(
            cfg, self.method, self.policy_loss
        )
        loss = LoadedLoss(loss_fn, prepare_fn, method_config(cfg, self.policy_loss.section))
        r = cfg.reward  # reward_callables: functions of reward.functions run in this process
        self.rewards = reward_functions(
            r.functions, r.weights, reward_callables, r.correctness, r.max_error_rate
        )
        self.method_state = load(self.method.new_state)() if self.method.new_state else None
        processes, faults = ProcessGroup(), Faults.from_env()  # faults: where a test makes the run fail
        setup.check_machine(cfg)
        setup.check_world_size(cfg, processes.world)
        # data before the run directory: a missing file or column fails with nothing written
        eval_problems, stages, transfer = run_problems(cfg)
        if (threads := torch_threads(cfg.trainer.num_threads, torch.get_num_threads())) is not None:
            torch.set_num_threads(threads)  # before model.dtype=auto's probe, which runs on them
        cfg = self.cfg = setup.resolve_dtype(cfg, resume, processes)  # before config.yaml records it
        ckpt = setup.prepare_run_dir(cfg, resume, processes)
        run_dir = Path(cfg.logging.output_dir)
        # The trackers start before the models load too, so a tracker that cannot start fails the run
        # before the loading time is spent.
        self.env = RunEnvironment(
            run_dir,
            processes,
            faults,
            setup.seed_everything(cfg.trainer.seed + processes.rank),  # one random stream per process
            RunLog(run_dir, processes.is_main, partial(setup.start_trackers, cfg)),
            setup.stall_watchdog(cfg, cfg.rollout.engine, run_dir, faults),
        )
        self.eval_sets = {name: ps for name, ps in (("eval", eval_problems), ("transfer", transfer)) if ps}
        self.curriculum = Curriculum(stages, cfg.trainer.steps, cfg.trainer.seed)  # the data order: shared
        try:
            self._start(cfg, ckpt, loss, reuse_first_forward)
        except BaseException:
            self.env.close()  # the trackers opened above
            raise

    def _start(self, cfg: Config, ckpt: Path | None, loss: LoadedLoss, reuse_first_forward: bool) -> None:
        """Load the models, the verifiers and the update, and restore ``ckpt`` when resuming."""
        env = self.env
        with env.processes.state.main_process_first():  # one process converts a GGUF into the cache
            model_path = str(ckpt) if ckpt else resolve_model_path(cfg.model.name, cfg.model.cache_dir)
        needs_ref = (
            cfg.algorithm.kl_coef > 0
            or cfg.logging.log_ref_kl
            or self.policy_loss.needs_reference(loss.config.options)
        )
        models = self.models = setup.load_models(cfg, model_path, env.processes, needs_ref)
        env.faults.at("load", 0)
        trained = [p for stage in self.curriculum.stages for p in stage]
        setup.check_prompt_lengths(models.tokenizer, trained + self.eval_sets.get("transfer", []), cfg)
        packing = setup.packing_enabled(cfg, models.model)
        self.pool = VerifierPool.from_config(cfg.reward, self.rewards.pool_functions)
        # with a curriculum that restarts each stage, the schedule spans one stage
        reset = cfg.data.curriculum_reset_optimizer
        schedule_steps = self.curriculum.schedule.steps_of(0) if reset else cfg.trainer.steps
        settings, scaler = UpdateConfig.from_config(cfg), models.precision.grad_scaler(env.processes.device)
        optim = Optimization(models.model, settings, env.processes, schedule_steps, scaler)
        bonus = EntropyBonus.from_config(cfg.algorithm)
        self.run = RunState(0, self.curriculum, optim, env.generator, bonus)
        self.actor = Actor(
            settings,
            PolicyModels(models.model, models.ref_model, models.reference_weights, models.precision, packing),
            loss,
            ActorState(optim, bonus, env.generator),
            env.processes,
            reuse_first_forward=reuse_first_forward,
            faults=env.faults,
        )
        self.resumed = ckpt is not None
        if ckpt is not None:
            restore_run(ckpt, self.run, models.model, cfg, env.processes)
            if self.curriculum.stage > 0 and reset and models.ref_model is not None:
                load_stage_reference(env.run_dir, self.curriculum.stage, models.ref_model, cfg.model.dtype)
            env.log.truncate_after(self.run.step)
            logger.info("resumed from %s at step %d", ckpt, self.run.step)

    @property
    def step(self) -> int:
        return self.run.step

    def save(self) -> Path:
        """A checkpoint of the run at this step (``semrl.runtime.run_state.save_run``; a collective)."""
        return save_run(self.env, self.run, self.models, self.cfg)

    def close(self) -> None:
        """End what the run holds besides its models: the watchdog's thread, the trackers and the
        verifier processes. ``train`` ends with it; a caller that runs the stages by hand (``collect``,
        ``rollout``, ``learn``, ``evaluate``) calls it, or uses the Trainer in a ``with`` block."""
        self.env.close()
        self.pool.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------
    # The loop

    def train(self) -> dict[str, float]:
        cfg, run, env, models = self.cfg, self.run, self.env, self.models
        last: dict[str, float] = {}
        # SIGTERM / SIGINT: finish this step (or the base evaluation), checkpoint, exit
        stop = StopSignal().install()
        bar = None
        try:
            # a run resumed at step 0 stopped after its base evaluation, which its log holds
            if run.step == 0 and not self.resumed and self.eval_sets and cfg.logging.eval_base:
                env.log.metrics({"step": 0, **self.evaluate()})
                self._stop_if_needed(None, stop)
            bar = Progress(
                cfg.trainer.steps, "train", "step", cfg.logging.progress and env.processes.is_main, run.step
            )
            while run.step < cfg.trainer.steps:
                if self.curriculum.advances(run.step):  # checkpoint, next stage (and its reference)
                    advance_stage(self.env, run, self.models, cfg)
                t0, cpu0 = time.perf_counter(), time.process_time()
                collected = self.collect()
                batch, scores = collected.batch, collected.scores
                models.engine.release_memory()  # vllm sleep mode: the update gets the engine's memory
                t1, cpu1 = time.perf_counter(), time.process_time()
                clock = PhaseClock(device_synchronize(env.processes.device.type))
                advantages, advantage_metrics, update = self.learn(batch, scores, clock)
                # the sampling entropies the update's forwards measured where the engine gave none (vllm)
                measured = update.sampling_entropy
                if measured is not None:
                    measured = measured * batch.sequences.response_mask
                # the next rollout samples the new weights: FSDP gathers them for the engine's copy,
                # vllm takes them in place (a no-op for hf, which samples from the trained model)
                with clock.phase("sync"):
                    full = iter_full_parameters(models.model) if cfg.trainer.fsdp else None
                    models.engine.sync_weights(full)
                t3, cpu3 = time.perf_counter(), time.process_time()
                run.step += 1
                last = {
                    "step": run.step,
                    **collected.metrics,
                    **rollout_metrics(batch, scores, measured),
                    **entropy_metrics(batch, advantages, cfg.logging.low_entropy_threshold, measured),
                    **batch.metrics,
                    **advantage_metrics,
                    **update.metrics,
                    "lr": run.optim.lr,
                    "curriculum/stage": float(self.curriculum.stage + 1),
                    "time/rollout_s": collected.rollout_s,
                    "time/reward_s": collected.reward_s,
                    "time/update_s": t3 - t1,
                    **clock.metrics("time/update"),  # its phases (docs/training.md)
                    "time/step_s": t3 - t0,
                    # this process's CPU seconds (every thread): far below wall x threads on a busy
                    # machine (docs/benchmarks.md, "A busy machine")
                    "time/collect_cpu_s": cpu1 - cpu0,
                    "time/update_cpu_s": cpu3 - cpu1,
                }
                last = env.processes.mean_metrics(last)
                every = cfg.logging.eval_every
                if self.eval_sets and (run.step == cfg.trainer.steps or (every and run.step % every == 0)):
                    last.update(self.evaluate())
                env.log.metrics(last)
                env.log.samples(
                    batch,
                    scores,
                    advantages,
                    run.step,
                    models.tokenizer,
                    cfg.logging.samples_per_step,
                    cfg.logging.trees_per_step,
                )
                saved, save_every = None, cfg.logging.save_every
                if (save_every and run.step % save_every == 0) or run.step == cfg.trainer.steps:
                    saved = self.save()
                self._stop_if_needed(saved, stop)
                bar.update(1)
                if bar.plain:  # no terminal for a bar: one line per step
                    logger.info(step_line(last, cfg.trainer.steps))
                bar.bar.set_postfix(
                    reward=f"{last['reward']:.3f}",
                    acc=f"{last['accuracy']:.3f}",
                    entropy=f"{last['entropy']:.2f}",
                    len=f"{last['response_length']:.0f}",
                    s_per_step=f"{last['time/step_s']:.1f}",
                )
        finally:
            stop.uninstall()
            if bar is not None:
                bar.close()
            self.close()
        env.processes.barrier()
        return last

    def _stop_if_needed(self, saved: Path | None, stop: StopSignal) -> None:
        """Stop with a checkpoint (``saved``, this step's, or a new one) after too many bad updates,
        or before the next step when any process received a stop signal."""
        limit, bad = self.cfg.trainer.max_bad_updates, self.run.optim.consecutive_bad_updates
        if limit > 0 and bad >= limit:
            raise TrainingError.bad_updates(bad, limit, self.step, saved or self.save(), self.env.run_dir)
        if self.step < self.cfg.trainer.steps and not self.env.processes.all_true(stop.received is None):
            name = signal.Signals(stop.received).name if stop.received else "a stop signal (another process)"
            raise Preempted(name, self.step, saved or self.save(), self.env.run_dir)

    # ------------------------------------------------------------------------------------------
    # Stages of a step

    def collect(self) -> CollectedStep:
        """Rollout + reward, in rounds while DAPO's dynamic sampling wants more informative groups
        (``semrl.rollout.group_filter.GroupFilter``)."""
        wanted = self.cfg.rollout.prompts_per_step // self.env.processes.world
        groups = GroupFilter(wanted, self.cfg.algorithm, self.env.processes)
        cost_before, rollout_s, reward_s, trajectories = self.models.engine.cost.snapshot(), 0.0, 0.0, 0
        while not groups.full:
            t0 = time.perf_counter()
            batch = self.rollout(groups.rounds)
            t1 = time.perf_counter()
            groups.add(batch, self.reward(batch))
            rollout_s, reward_s = rollout_s + t1 - t0, reward_s + time.perf_counter() - t1
            trajectories += len(batch.generations)
        batch, scores, filter_metrics = groups.result()
        # over every sequence sampled, dropped groups too
        metrics = {**reward_metrics(groups.sampled), **filter_metrics}
        cost = self.models.engine.cost.since(cost_before)
        metrics.update(cost_metrics(cost, trajectories, rollout_s, self.env.processes.sum))
        return CollectedStep(batch, scores, metrics, rollout_s, reward_s)

    def rollout(self, round_index: int = 0) -> RolloutBatch:
        """G samples for each prompt of this process's share of the step's global batch; a stalled
        engine stops the run (``rollout.stall_timeout_s``)."""
        with self.env.watchdog.watching(phase("rollout", self.step + 1)):
            return self._rollout(round_index)

    def _rollout(self, round_index: int) -> RolloutBatch:
        cfg, group, models = self.cfg, self.cfg.rollout.group_size, self.models
        # Every process draws the same global batch, then takes its own share of it.
        global_batch = self.curriculum.sampler.next_indices(cfg.rollout.prompts_per_step)
        share = self.env.processes.share(len(global_batch))  # positions in the global batch
        problems = [self.curriculum.problems[global_batch[k]] for k in share]
        prompt_ids = [self.prompt.ids(models.tokenizer, p.problem) for p in problems]
        params = sampling_params(cfg.rollout, top_logprobs=self.method.reads_top_logprobs)
        seed, step, dtype = cfg.trainer.seed, self.step, models.engine.compute_dtype
        independent = cfg.rollout.seed_per_sequence and self.method.rollout_fn is None
        context = RolloutContext(
            models.engine,
            params,
            self.env.generator,
            self.method_config,
            partial(  # the entropy at the weights that sampled, in the engine's dtype
                with_sampling_entropy,
                models.rollout_model,
                temperature=params.temperature,
                compute_dtype=dtype,
            ),
            self.method_state,
            decode=partial(models.tokenizer.decode, skip_special_tokens=True),
            step=step,
            prompt_seeds=[prompt_seed(seed, step, round_index, k) for k in share],
            sample_seeds=group_seeds(seed, step, round_index, share, group) if independent else None,
        )
        out = self.rollout_fn(context, prompt_ids)
        gens, groups, metrics, sequence_prompts = (
            out.generations,
            out.groups,
            out.metrics,
            out.sequence_prompt_ids,
        )
        self.env.faults.at("rollout", self.step + 1)
        return RolloutBatch(
            problems=[p for p in problems for _ in range(group)],
            prompt_ids=sequence_prompts or [ids for ids in prompt_ids for _ in range(group)],
            generations=gens,
            texts=[models.tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in gens],
            group_size=group,
            pad_token_id=models.tokenizer.pad_token_id,
            groups=groups or [],
            metrics=metrics,
        )

    def reward(self, batch: RolloutBatch) -> Scores:
        """Every response's score (``semrl.reward.score``)."""
        cfg = self.cfg
        limit = cfg.rollout.max_new_tokens
        return score(
            batch.problems, batch.texts, batch.generations, self.rewards, self.pool, cfg.reward, limit
        )

    def learn(
        self, batch: RolloutBatch, scores: Scores, clock: PhaseClock | None = None
    ) -> tuple[torch.Tensor, dict[str, float], UpdateResult]:
        """The update stage of one step: the (N, T) advantages with their metrics, and the actor's
        update from the current weights, its no-gradient passes included (the benchmarks time
        exactly this), its phases timed on ``clock``."""
        clock = PhaseClock() if clock is None else clock
        with clock.phase("advantages"):
            advantages, advantage_metrics = self.advantages(batch, scores)
        update = self.actor.update(batch, advantages, self.run.step + 1, clock)
        return advantages, advantage_metrics, update

    def advantages(self, batch: RolloutBatch, scores: Scores) -> tuple[torch.Tensor, dict[str, float]]:
        """(N, T) advantages from the method's estimator, and its metrics."""
        inputs = AdvantageInputs(
            scores.rewards,
            batch.group_ids,
            batch.sequences.response_mask,
            batch.groups,
            answers=[r.answer for r in scores.results],
            correct=[r.correct for r in scores.results],
            logprobs=batch.rollout_logprobs,
        )
        return self.advantage_fn(inputs, self.method_config)

    def evaluate(self) -> dict[str, float]:
        """mean@k / pass@k on the held-out problems and the transfer split (``eval/`` and
        ``transfer/`` metrics on the main process; problem records in ``RUN_DIR/eval``)."""
        self.env.faults.at("evaluate", self.step)
        splits, first = self.eval_sets, self.cfg.logging.eval_base_problems
        if self.step == 0 and first is not None:  # the base model on a subset (logging.eval_base_problems)
            splits = {split: problems[:first] for split, problems in splits.items()}
        with self.env.watchdog.watching(phase("evaluate", self.step)):
            return evaluate_splits(
                self.models.engine,
                self.models.tokenizer,
                self.pool,
                splits,
                self.cfg,
                self.env.processes,
                self.step,
                self.env.run_dir,
                self.rewards,
            )
