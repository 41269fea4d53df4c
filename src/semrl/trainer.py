"""The RLVR training loop: rollout -> reward -> advantages -> update -> log.

Read it top to bottom: ``Trainer.train`` is the loop, each stage is one method. Methods differ
only through the registry (``semrl.algos.registry``): their advantage estimator and loss defaults.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from semrl.algos.losses import aggregate_loss, kl_penalty, masked_mean
from semrl.algos.policy_losses import MiniBatchInputs, PolicyLossInputs, get_policy_loss
from semrl.algos.registry import AdvantageInputs, resolve_algorithm
from semrl.algos.token_selection import token_covariance
from semrl.batch import RolloutBatch, gather_groups
from semrl.checkpoint import (
    checkpoint_dir,
    cleanup_partial,
    latest_checkpoint,
    load_trainer_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from semrl.config import Config, ConfigError, save_config
from semrl.curriculum import curriculum_stages, load_curriculum
from semrl.data import (
    DataError,
    EpochSampler,
    Problem,
    build_prompt_ids,
    load_problems,
    make_arithmetic_problems,
    resolve_dataset,
)
from semrl.distributed import (
    ProcessGroup,
    full_optimizer_state,
    full_state_dict,
    load_full_state_dict,
    load_optimizer_state,
    shard_model,
)
from semrl.engine import Engine, build_engine
from semrl.errors import TrainingError
from semrl.evaluation import sample_problems, summarize_records
from semrl.faults import kill_point
from semrl.forward import response_logprobs
from semrl.jsonl import read_jsonl
from semrl.models import load_model, load_tokenizer, resolve_model_path
from semrl.packing import pack_rows, packed_response_logprobs, supports_packing, unpack_order
from semrl.reward import VerifierPool, score_responses
from semrl.reward.shaping import overlong_penalty
from semrl.rollout import GenerationRequest, SamplingParams
from semrl.tree_log import tree_records

logger = logging.getLogger(__name__)

ARITHMETIC = "arithmetic"
EVAL_SEED_OFFSET = 10_007  # held-out arithmetic problems use another seed and exclude train texts


def load_dataset(name: str, cfg: Config, split: str, exclude: set[str] | None = None) -> list[Problem]:
    """Problems of ``data.train`` / ``data.eval``; ``exclude`` removes held-out problem texts."""
    if name == ARITHMETIC:
        seed = cfg.trainer.seed + (EVAL_SEED_OFFSET if split == "eval" else 0)
        size = cfg.data.arithmetic_size if split == "train" else cfg.data.eval_size
        return make_arithmetic_problems(size, cfg.data.arithmetic_levels, seed, exclude)
    problems, skipped = load_problems(resolve_dataset(name), cfg.data.skip_bad_rows)
    if skipped:
        logger.warning("%s: skipped %d bad rows (data.skip_bad_rows=true)", name, skipped)
    if exclude:
        problems = [p for p in problems if p.problem not in exclude]
    return problems


def seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: Config, total_updates: int) -> Any:
    warmup, schedule = cfg.trainer.warmup_steps, cfg.trainer.lr_schedule

    def factor(update: int) -> float:
        if warmup > 0 and update < warmup:
            return (update + 1) / warmup
        progress = (update - warmup) / max(1, total_updates - warmup)
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        if schedule == "linear":
            return max(0.0, 1.0 - progress)
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Trainer:
    def __init__(self, cfg: Config, resume: bool = False) -> None:
        self.cfg = cfg
        self.method = resolve_algorithm(cfg.algorithm)
        self.policy_loss = get_policy_loss(cfg.algorithm.policy_loss)  # type: ignore[arg-type]
        self.run_dir = Path(cfg.logging.output_dir)
        self.procs = ProcessGroup()
        self._check_world_size()
        ckpt = self._prepare_run_dir(resume)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        # one random stream per process; the data order (EpochSampler) is shared by all
        self.generator = seed_everything(cfg.trainer.seed + self.procs.rank)

        # Data first: a bad file fails before any model is loaded. Held-out problems are drawn
        # first so that the training set can exclude them (1-digit sums have only 100 problems).
        self.eval_problems = (
            load_dataset(cfg.data.eval, cfg, "eval")[: cfg.data.eval_size] if cfg.data.eval else []
        )
        if cfg.data.eval and not self.eval_problems:
            raise DataError(f"data.eval '{cfg.data.eval}' gave no problems; raise data.eval_size")
        held_out = {p.problem for p in self.eval_problems}
        if cfg.data.curriculum:  # SENT: stages of increasing semantic entropy
            scored = [(p, h) for p, h in load_curriculum(cfg.data.curriculum) if p.problem not in held_out]
            self.stages = curriculum_stages(scored, cfg.data.curriculum_stages)
        else:
            self.stages = [load_dataset(cfg.data.train, cfg, "train", held_out)]
        if not all(self.stages):
            raise DataError(
                f"data.train '{cfg.data.train}' has no problems left after removing the held-out ones; "
                "add arithmetic levels or lower data.eval_size"
            )
        # stage k trains steps [stage_ends[k-1], stage_ends[k])
        self.stage_ends = [round((k + 1) * cfg.trainer.steps / len(self.stages)) for k in range(len(self.stages))]
        self._enter_stage(0)

        with self.procs.state.main_process_first():  # one process converts a GGUF into the cache
            model_path = str(ckpt) if ckpt else resolve_model_path(cfg.model.name, cfg.model.cache_dir)
        self.tokenizer = load_tokenizer(model_path)
        self.model = load_model(model_path, cfg.model.dtype, cfg.model.attn_implementation)
        self.model.to(self.procs.device)
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        # The model the engine samples from: the trained one, or with FSDP on hf a full copy synced
        # after each update. With FSDP on vllm the engine takes the model before it is sharded and
        # then gathered full tensors after each update: no second copy.
        self.rollout_model = self.model
        if cfg.trainer.fsdp and cfg.rollout.engine == "hf":
            self.rollout_model = load_model(model_path, cfg.model.dtype, cfg.model.attn_implementation)
            self.rollout_model.requires_grad_(False).eval().to(self.procs.device)
        r = cfg.rollout
        self.engine: Engine = build_engine(
            r.engine, self.rollout_model, self.tokenizer, r.generation_batch_size,
            cfg.data.max_prompt_length + r.max_new_tokens, r.logprobs_top_k, cfg.trainer.seed + self.procs.rank, r,
        )
        if cfg.trainer.fsdp:
            shard_model(self.model)
            if self.rollout_model is self.model:  # vllm: from now on it sees only gathered tensors
                self.engine.sync_weights(full_state_dict(self.model))
        self.ref_model = None
        if cfg.algorithm.kl_coef > 0 or cfg.logging.log_ref_kl or self.policy_loss.needs_reference(cfg):
            # no reference model is loaded when nothing reads it (beta = 0)
            ref_path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
            self.ref_model = load_model(ref_path, cfg.model.dtype, cfg.model.attn_implementation)
            self.ref_model.requires_grad_(False).eval().to(self.procs.device)
        self._check_prompt_lengths()
        self.packing = cfg.trainer.packing == "tree" and supports_packing(self.model)
        if cfg.trainer.packing == "tree" and not self.packing:
            logger.warning(
                "trainer.packing=tree: model type '%s' is not known to take a 4D attention mask; "
                "using padded rows", getattr(self.model.config, "model_type", "?"),
            )

        self.pool = VerifierPool(cfg.reward.num_workers, cfg.reward.timeout_s)
        # with a curriculum that restarts each stage, the schedule spans one stage
        self._new_optimizer(self.stage_ends[0] if cfg.data.curriculum_reset_optimizer else cfg.trainer.steps)
        self.step = 0
        self.consecutive_bad_updates = 0
        if ckpt is not None:
            self._restore(ckpt)
        self.tb = None
        if cfg.logging.tensorboard and self.procs.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))

    # ------------------------------------------------------------------------------------------
    # Setup helpers

    def _prepare_run_dir(self, resume: bool) -> Path | None:
        ckpt = latest_checkpoint(self.run_dir)
        holds_run = ckpt is not None or (self.run_dir / "metrics.jsonl").exists()
        self.procs.barrier()  # every process has looked before the main one writes
        if resume:
            if ckpt is None:
                raise ConfigError(f"--resume: no complete checkpoint in {self.run_dir / 'checkpoints'}")
            if self.procs.is_main:
                cleanup_partial(self.run_dir)
            return ckpt
        if holds_run:
            raise ConfigError(
                f"run directory {self.run_dir} already holds a run; continue it with "
                f"'semrl train --resume {self.run_dir}' or set logging.output_dir to a new directory"
            )
        if self.procs.is_main:
            cleanup_partial(self.run_dir)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(self.cfg, self.run_dir / "config.yaml")
        return None

    def _check_world_size(self) -> None:
        world, cfg = self.procs.world, self.cfg
        if cfg.rollout.prompts_per_step % world:
            raise ConfigError(
                f"rollout.prompts_per_step ({cfg.rollout.prompts_per_step}) must be a multiple of the "
                f"number of processes ({world}): each process takes whole prompt groups"
            )
        if cfg.trainer.fsdp and world == 1:
            raise ConfigError("trainer.fsdp shards over processes; start several with 'semrl train --num-processes N'")
        needs_forward = (cfg.algorithm.method == "fr3e" and cfg.fr3e.anchor_metric == "entropy") or (
            cfg.algorithm.method == "rose" and cfg.rose.entropy_mode == "full_vocab"
        )
        if cfg.trainer.fsdp and cfg.rollout.engine == "vllm" and needs_forward:
            raise ConfigError(
                "with trainer.fsdp and rollout.engine=vllm the rollout cannot run a forward pass for entropies "
                "(fr3e.anchor_metric=entropy, rose.entropy_mode=full_vocab); use fr3e.anchor_metric=surprisal, "
                "rose.entropy_mode=topk_logprobs, or rollout.engine=hf"
            )
        if cfg.trainer.fsdp and cfg.trainer.packing == "tree":
            raise ConfigError("trainer.packing=tree does not work with trainer.fsdp yet; set trainer.packing=none")
        mini = cfg.trainer.mini_batch_size
        if mini is not None and mini % world:
            raise ConfigError(f"trainer.mini_batch_size ({mini}) must be a multiple of the number of processes ({world})")

    def _check_prompt_lengths(self) -> None:
        limit = self.cfg.data.max_prompt_length
        for p in [p for stage in self.stages for p in stage][:1000]:
            n = len(build_prompt_ids(self.tokenizer, p.problem, self.cfg.data.system_prompt))
            if n > limit:
                raise DataError(
                    f"problem '{p.id}' has a {n}-token prompt, over data.max_prompt_length={limit}; "
                    "raise data.max_prompt_length or drop the problem"
                )

    def _enter_stage(self, stage: int) -> None:
        self.stage = stage
        self.train_problems = self.stages[stage]
        self.sampler = EpochSampler(len(self.train_problems), self.cfg.trainer.seed + stage)

    def _new_optimizer(self, steps: int) -> None:
        cfg = self.cfg
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.trainer.lr,
            betas=tuple(cfg.trainer.betas),  # type: ignore[arg-type]
            weight_decay=cfg.trainer.weight_decay,
        )
        self.scheduler = make_scheduler(self.optimizer, cfg, steps * self._updates_per_step())

    def _stage_reference_dir(self, stage: int) -> Path:
        return self.run_dir / "curriculum" / f"stage-{stage}"

    def _advance_stage(self) -> None:
        """Curriculum: move to the next stage once this one's steps are done. With
        ``data.curriculum_reset_optimizer`` the new stage starts like a run from the previous
        stage's final checkpoint: fresh optimizer and schedule, and those weights as reference."""
        if self.stage + 1 >= len(self.stages) or self.step < self.stage_ends[self.stage]:
            return
        self.save()
        self._enter_stage(self.stage + 1)
        logger.info("curriculum: stage %d of %d from step %d", self.stage + 1, len(self.stages), self.step)
        if self.cfg.data.curriculum_reset_optimizer:
            self._new_optimizer(self.stage_ends[self.stage] - self.step)
            if self.ref_model is not None:
                weights = self._full_weights()
                if weights is None:
                    self.ref_model.load_state_dict(self.rollout_model.state_dict())
                else:
                    load_full_state_dict(self.ref_model, weights)
                if self.procs.is_main:
                    save_checkpoint(
                        self._stage_reference_dir(self.stage), self.step, self.rollout_model, self.tokenizer, {}, 1,
                        model_state=weights,
                    )
                self.procs.barrier()

    def _updates_per_step(self) -> int:
        total = self.cfg.rollout.prompts_per_step * self.cfg.rollout.group_size
        mini = self.cfg.trainer.mini_batch_size or total
        return self.cfg.trainer.ppo_epochs * (total // mini)

    def _restore(self, ckpt: Path) -> None:
        state = load_trainer_state(ckpt)
        self._enter_stage(state.get("stage", 0))
        if self.stage > 0 and self.cfg.data.curriculum_reset_optimizer:
            steps = self.stage_ends[self.stage] - self.stage_ends[self.stage - 1]
            self._new_optimizer(steps)
            reference = latest_checkpoint(self._stage_reference_dir(self.stage))
            if self.ref_model is not None and reference is not None:
                self.ref_model.load_state_dict(load_model(str(reference), self.cfg.model.dtype).state_dict())
        if self.cfg.trainer.fsdp:
            load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        rng = state["rng"]
        if isinstance(rng, list):  # one state per process
            if len(rng) != self.procs.world:
                raise ConfigError(
                    f"the checkpoint {ckpt} was written by {len(rng)} processes; resume it with "
                    f"--num-processes {len(rng)} (this run has {self.procs.world})"
                )
            rng = rng[self.procs.rank]
        elif self.procs.distributed:
            raise ConfigError(f"the checkpoint {ckpt} was written by 1 process; resume it with 1 process")
        set_rng_state(rng, self.generator)
        self.step = state["step"]
        self.consecutive_bad_updates = state.get("consecutive_bad_updates", 0)
        # Lines logged after this checkpoint belong to steps that will be re-run.
        for name in ("metrics.jsonl", "samples.jsonl", "trees.jsonl") if self.procs.is_main else ():
            log = self.run_dir / name
            if log.exists():
                kept = [row for row in read_jsonl(log) if row.get("step", 0) <= self.step]
                log.write_text("".join(json.dumps(row) + "\n" for row in kept), encoding="utf-8")
        logger.info("resumed from %s at step %d", ckpt, self.step)

    def _full_weights(self) -> dict[str, torch.Tensor] | None:
        """The trained weights whole (a collective under FSDP on vllm, which keeps no full copy);
        None where ``rollout_model`` holds them."""
        if self.cfg.trainer.fsdp and self.rollout_model is self.model:
            return full_state_dict(self.model)
        return None

    def save(self) -> Path:
        """Checkpoint written by the main process (every process holds the same weights)."""
        rngs = self.procs.gather(rng_state(self.generator))
        optimizer = (
            full_optimizer_state(self.model, self.optimizer) if self.cfg.trainer.fsdp else self.optimizer.state_dict()
        )
        state = {
            "step": self.step,
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": rngs if self.procs.distributed else rngs[0],
            "consecutive_bad_updates": self.consecutive_bad_updates,
            "stage": self.stage,
            "config": self.cfg.to_dict(),
        }
        path = checkpoint_dir(self.run_dir, self.step)
        weights = self._full_weights()
        if self.procs.is_main:
            path = save_checkpoint(
                self.run_dir, self.step, self.rollout_model, self.tokenizer, state, self.cfg.logging.keep_last,
                model_state=weights,
            )
        self.procs.barrier()
        return path

    # ------------------------------------------------------------------------------------------
    # The loop

    def train(self) -> dict[str, float]:
        cfg = self.cfg
        if self.step == 0 and self.eval_problems:
            self._log({"step": 0, **self.evaluate()})
        bar = tqdm(
            total=cfg.trainer.steps, initial=self.step, desc="train",
            disable=not (cfg.logging.progress and self.procs.is_main), dynamic_ncols=True,
        )
        last: dict[str, float] = {}
        try:
            while self.step < cfg.trainer.steps:
                self._advance_stage()
                t0 = time.perf_counter()
                batch, reward_metrics, t_reward = self.collect()
                t1 = time.perf_counter()
                advantages = self.advantages(batch)
                update_metrics = self.update(batch, advantages)
                # the next rollout samples the new weights: FSDP gathers them for the engine's copy,
                # vllm takes them in place (a no-op for hf, which samples from the trained model)
                self.engine.sync_weights(full_state_dict(self.model) if cfg.trainer.fsdp else None)
                t3 = time.perf_counter()
                self.step += 1
                last = {
                    "step": self.step,
                    **reward_metrics,
                    **self._rollout_metrics(batch),
                    **self._entropy_metrics(batch, advantages),
                    **batch.extras.get("metrics", {}),
                    **update_metrics,
                    "lr": self.scheduler.get_last_lr()[0],
                    "curriculum/stage": float(self.stage + 1),
                    "time/rollout_s": t1 - t0 - t_reward,
                    "time/reward_s": t_reward,
                    "time/update_s": t3 - t1,
                    "time/step_s": t3 - t0,
                }
                last = self.procs.mean_metrics(last)
                if cfg.logging.eval_every and self.step % cfg.logging.eval_every == 0 and self.step < cfg.trainer.steps:
                    last.update(self.evaluate())
                if self.step == cfg.trainer.steps and self.eval_problems:
                    last.update(self.evaluate())
                self._log(last)
                self._write_samples(batch, advantages)
                saved = None
                if (cfg.logging.save_every and self.step % cfg.logging.save_every == 0) or self.step == cfg.trainer.steps:
                    saved = self.save()
                self._stop_on_bad_updates(saved)
                bar.update(1)
                bar.set_postfix(
                    reward=f"{last['reward']:.3f}", acc=f"{last['accuracy']:.3f}",
                    entropy=f"{last['entropy']:.2f}", len=f"{last['response_length']:.0f}",
                    s_per_step=f"{last['time/step_s']:.1f}",
                )
        finally:
            bar.close()
            self.pool.close()
            if self.tb is not None:
                self.tb.close()
        self.procs.barrier()
        return last

    def _stop_on_bad_updates(self, saved: Path | None) -> None:
        """Stop with a checkpoint (``saved``, this step's, or a new one) after too many bad updates."""
        limit = self.cfg.trainer.max_bad_updates
        if limit <= 0 or self.consecutive_bad_updates < limit:
            return
        ckpt = saved or self.save()
        raise TrainingError(
            f"{self.consecutive_bad_updates} optimizer updates in a row had a NaN/inf loss or gradient norm "
            f"and were skipped (trainer.max_bad_updates={limit}), the last at step {self.step}. The weights are "
            f"those of the last good update, saved in {ckpt}. Look for the cause (learning rate, "
            "model.dtype=float16 overflow, rewards), then continue with 'semrl train --resume "
            f"{self.run_dir}' and any overrides, or set trainer.max_bad_updates=0 to keep skipping."
        )

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
        kept: list[tuple[RolloutBatch, int]] = []
        dropped: list[tuple[RolloutBatch, int]] = []
        reward_seconds = 0.0
        while True:
            batch = self.rollout(len(sampled))
            t0 = time.perf_counter()
            self.reward(batch)
            reward_seconds += time.perf_counter() - t0
            sampled.append(batch)
            if not algo.dynamic_sampling:
                return batch, self._reward_metrics(sampled), reward_seconds
            grouped = batch.group_rewards() if algo.dynamic_sampling_metric == "reward" else batch.group_correct()
            informative = grouped.max(1).values > grouped.min(1).values
            for g in range(batch.num_groups):
                (kept if informative[g] else dropped).append((batch, g))
            if self.procs.all_true(len(kept) >= wanted) or len(sampled) >= algo.max_sampling_rounds:
                break
        if len(kept) < wanted:
            logger.warning(
                "dynamic sampling: %d of %d groups have distinct rewards after %d rollout batches "
                "(algorithm.max_sampling_rounds); filling with zero-advantage groups", len(kept), wanted, len(sampled),
            )
        chosen = (kept + dropped)[:wanted]
        metrics = self._reward_metrics(sampled)
        metrics["dynamic_sampling/rollout_batches"] = float(len(sampled))
        metrics["dynamic_sampling/kept_groups"] = self.procs.sum(min(len(kept), wanted))
        metrics["dynamic_sampling/filled_groups"] = self.procs.sum(max(0, wanted - len(kept)))
        return gather_groups(chosen), metrics, reward_seconds

    def rollout(self, round_index: int = 0) -> RolloutBatch:
        """G samples for each prompt of this process's share of the step's global batch."""
        cfg = self.cfg
        group = cfg.rollout.group_size
        global_batch = self.sampler.next_indices(cfg.rollout.prompts_per_step)  # the same on every process
        share = self.procs.share(len(global_batch))  # positions in the global batch
        problems = [self.train_problems[global_batch[k]] for k in share]
        prompt_ids = [build_prompt_ids(self.tokenizer, p.problem, cfg.data.system_prompt) for p in problems]
        extras: dict[str, Any] = {}
        if self.method.rollout_fn is not None:
            gens, extras = self.method.rollout_fn(self, prompt_ids)
        else:
            requests = [
                GenerationRequest(ids, seed=self._sequence_seed(round_index, k, j))
                for k, ids in zip(share, prompt_ids, strict=True) for j in range(group)
            ]
            gens = self.engine.generate(requests, self._sampling_params(), self.generator)
        kill_point("rollout", self.step + 1)
        return RolloutBatch(
            problems=[p for p in problems for _ in range(group)],
            # a method whose trained prompts include a prefix (FR3E) gives them per sequence
            prompt_ids=extras.pop("sequence_prompt_ids", None) or [ids for ids in prompt_ids for _ in range(group)],
            generations=gens,
            texts=[self.tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in gens],
            group_size=group,
            pad_token_id=self.tokenizer.pad_token_id,
            extras=extras,
        )

    def _sequence_seed(self, round_index: int, prompt: int, sample: int) -> int | None:
        """Seed of sample ``sample`` of prompt ``prompt`` (index in the global batch) of this step's
        rollout round ``round_index``, with ``rollout.seed_per_sequence``; else None."""
        if not self.cfg.rollout.seed_per_sequence:
            return None
        key = [self.cfg.trainer.seed, self.step, round_index, prompt, sample]
        return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0] >> 1)

    def reward(self, batch: RolloutBatch) -> None:
        """Score every response; fills ``batch.rewards`` and ``batch.reward_results``."""
        timeouts_before = self.pool.num_timeouts
        batch.reward_results = score_responses(
            self.pool,
            batch.texts,
            [p.answer for p in batch.problems],
            final_number_fallback=self.cfg.reward.final_number_fallback,
            truncated=[g.truncated for g in batch.generations],
            truncated_reward=self.cfg.reward.truncated_reward,
        )
        batch.rewards = torch.tensor([r.reward for r in batch.reward_results])
        rc = self.cfg.reward
        if rc.overlong_buffer_len > 0:
            lengths = torch.tensor([len(g.token_ids) for g in batch.generations])
            batch.rewards += overlong_penalty(
                lengths, self.cfg.rollout.max_new_tokens, rc.overlong_buffer_len, rc.overlong_penalty_factor
            )
        batch.verify_timeouts = self.pool.num_timeouts - timeouts_before

    def _reward_metrics(self, batches: list[RolloutBatch]) -> dict[str, float]:
        rewards = torch.cat([b.rewards for b in batches if b.rewards is not None])
        grouped = torch.cat([b.group_rewards() for b in batches])
        results = [r for b in batches for r in b.reward_results]
        g = batches[0].group_size
        # distinct extracted answers per group (None = no answer found counts as one more)
        distinct = [len({r.answer for r in results[i : i + g]}) for i in range(0, len(results), g)]
        return {
            "reward": rewards.mean().item(),
            "accuracy": float(np.mean([r.correct for r in results])),
            "reward/frac_groups_all_equal": (grouped.max(1).values == grouped.min(1).values).float().mean().item(),
            "reward/distinct_answers_per_group": float(np.mean(distinct)),
            "reward/verify_timeouts": float(sum(b.verify_timeouts for b in batches)),
        }

    def advantages(self, batch: RolloutBatch) -> torch.Tensor:
        assert batch.rewards is not None
        inputs = AdvantageInputs(
            batch.rewards, batch.group_ids, batch.sequences.response_mask, batch.extras,
            answers=[r.answer for r in batch.reward_results], logprobs=batch.rollout_logprobs,
        )
        return self.method.advantage_fn(inputs, self.cfg)

    def update(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """PPO epochs over mini-batches, gradient accumulation over micro-batches. With several
        processes, each holds its share of every mini-batch, losses use the global token and
        sequence counts, and gradients are summed before the optimizer step."""
        cfg, algo = self.cfg, self.cfg.algorithm
        seqs = batch.sequences
        total = seqs.input_ids.shape[0]
        world = self.procs.world
        mini = (cfg.trainer.mini_batch_size // world) if cfg.trainer.mini_batch_size else total
        micro = cfg.trainer.micro_batch_size
        temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
        # On-policy with a single update: pi_old = pi_theta, so the ratio is exactly 1 and the
        # extra forward pass for old log-probs is skipped.
        single_update = cfg.trainer.ppo_epochs == 1 and mini == total
        # An engine without entropies (vllm, docs/engines.md): they come from the trainer's forward at
        # the sampling weights, from the old-log-prob pass when there is one, else from a pass of their
        # own when a token selection needs them before the update, else from the update's forward.
        fill = not batch.has_rollout_entropy and (not single_update or self.policy_loss.prepare_fn is not None)
        old_logp = None
        if not single_update:
            old_logp = self._no_grad_logprobs(self.model, batch, temperature, fill)
        elif fill:
            self._no_grad_logprobs(self.model, batch, temperature, fill)
        update_entropy = None if batch.has_rollout_entropy else torch.zeros(seqs.response_mask.shape)
        ref_logp = self._no_grad_logprobs(self.ref_model, batch, temperature) if self.ref_model else None

        self.model.train()
        stats: dict[str, list[float]] = {}
        skipped = 0
        for _ in range(cfg.trainer.ppo_epochs):
            if self.packing:  # whole groups stay together so that micro-batches share prefixes
                g = batch.group_size
                groups = torch.randperm(total // g, generator=self.generator)
                order = (groups[:, None] * g + torch.arange(g)).flatten()
            else:
                order = torch.randperm(total, generator=self.generator)
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
                n_micro = math.ceil(len(mini_idx) / micro)
                for u_start in range(0, len(mini_idx), micro):
                    idx = mini_idx[u_start : u_start + micro]
                    logp, entropy, mask = self._logprobs(self.model, batch, idx, temperature, with_entropy=True)
                    r, dev = mask.shape[1], logp.device
                    if update_entropy is not None and entropy is not None:
                        update_entropy[idx, :r] = entropy.detach().float().cpu()
                    inputs = PolicyLossInputs(
                        logp=logp,
                        old_logp=logp.detach() if old_logp is None else old_logp[idx, :r].to(dev),
                        advantages=advantages[idx, :r].to(dev),
                        mask=mask,
                        entropy=None if entropy is None else entropy.detach(),
                        ref_logp=None if ref_logp is None else ref_logp[idx, :r].to(dev),
                        selection={k: v[u_start : u_start + len(idx), :r].to(dev) for k, v in selection.items()},
                        generator=self.generator,
                    )
                    token_loss, pg_metrics = self.policy_loss.loss_fn(inputs, cfg)
                    if inputs.ref_logp is not None:
                        kl = kl_penalty(logp, inputs.ref_logp, algo.kl_estimator)
                        if algo.kl_coef > 0:
                            token_loss = token_loss + algo.kl_coef * kl
                        stats.setdefault("kl", []).append(masked_mean(kl.detach(), mask).item())
                    loss = aggregate_loss(
                        token_loss, mask, algo.loss_agg_mode, num_sequences=len(mini_idx) * world,
                        num_tokens=num_tokens, max_response_length=cfg.rollout.max_new_tokens,
                    )
                    loss.backward()
                    kill_point("update", self.step + 1)
                    stats.setdefault("loss", []).append(loss.item())
                    for k, v in pg_metrics.items():
                        stats.setdefault(f"actor/{k}", []).append(v.item())
                    if entropy is not None:
                        stats.setdefault("actor/entropy", []).append(masked_mean(entropy, mask).item())
                if not cfg.trainer.fsdp:  # FSDP reduce-scatters the gradients during backward
                    self.procs.sum_gradients(self.model.parameters())
                grad_norm = self.procs.scalar(
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.trainer.max_grad_norm)
                )
                losses_finite = self.procs.all_true(all(math.isfinite(v) for v in stats["loss"][-n_micro:]))
                finite = bool(torch.isfinite(grad_norm)) and losses_finite
                skipped += not finite
                if finite:
                    self.optimizer.step()
                    self.consecutive_bad_updates = 0
                else:  # the weights stay as they were; the scheduler still advances
                    self.consecutive_bad_updates += 1
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                stats.setdefault("actor/grad_norm", []).append(grad_norm.item())
            if update_entropy is not None:  # single update: the first forward ran at the sampling weights
                batch.set_rollout_entropy(update_entropy)
                update_entropy = None
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        # this process's share of the loss; mean_metrics makes it the global loss over processes
        out["loss"] = float(np.sum(stats["loss"])) * world / (cfg.trainer.ppo_epochs * (total // mini))
        out["actor/skipped_updates"] = float(skipped)
        return out

    def _logprobs(
        self, model: Any, batch: RolloutBatch, idx: torch.Tensor, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Log-probs (n, r), entropies and response mask (n, r) of rows ``idx``, padded or packed."""
        if not self.packing:
            sub = batch.sequences.select(idx)
            logp, entropy = response_logprobs(model, sub, temperature, with_entropy=with_entropy)
            return logp, entropy, sub.response_mask.to(logp.device).float()
        rows = idx.tolist()
        packed, order = pack_rows(
            batch.prompt_ids, [g.token_ids.tolist() for g in batch.generations], rows, batch.group_size,
            batch.extras.get("groups", {}).get("trees"), batch.pad_token_id,
        )
        logp, entropy = packed_response_logprobs(model, packed, temperature, with_entropy=with_entropy)
        back = unpack_order(order)
        mask = packed.response_mask[back].to(logp.device).float()
        return logp[back], None if entropy is None else entropy[back], mask

    def _no_grad_logprobs(
        self, model: Any, batch: RolloutBatch, temperature: float, fill_entropy: bool = False
    ) -> torch.Tensor:
        """(N, T) log-probs of every response token under ``model`` (old policy or reference); with
        ``fill_entropy`` also the batch's rollout entropies (``model`` holds the sampling weights)."""
        out = torch.zeros(batch.sequences.response_mask.shape)
        entropies = torch.zeros_like(out)
        total, micro = len(batch.generations), self.cfg.trainer.micro_batch_size
        model.eval()
        with torch.no_grad():
            for start in range(0, total, micro):
                idx = torch.arange(start, min(start + micro, total))
                logp, entropy, _ = self._logprobs(model, batch, idx, temperature, with_entropy=fill_entropy)
                out[idx, : logp.shape[1]] = logp.cpu()
                if entropy is not None:
                    entropies[idx, : entropy.shape[1]] = entropy.float().cpu()
        if fill_entropy:
            batch.set_rollout_entropy(entropies)
        return out

    # ------------------------------------------------------------------------------------------
    # Evaluation and logging

    def _sampling_params(self, temperature: float | None = None) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(
            temperature=r.temperature if temperature is None else temperature,
            top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens, logprobs_top_k=r.logprobs_top_k,
        )

    def evaluate(self) -> dict[str, float]:
        """mean@k / pass@k on the held-out problems at the evaluation temperature. Each process
        samples every N-th problem; the main process gets the records and returns the metrics."""
        log, procs = self.cfg.logging, self.procs
        # A separate generator: evaluation must not change the training random stream.
        gen = torch.Generator().manual_seed(self.cfg.trainer.seed + 1 + 7919 * procs.rank)
        records = sample_problems(
            self.engine, self.tokenizer, self.pool, self.eval_problems[procs.rank :: procs.world],
            self._sampling_params(log.eval_temperature), log.eval_samples,
            self.cfg.data.system_prompt, self.cfg.reward.final_number_fallback, gen,
        )
        records = [r for share in procs.gather(records) for r in share]
        if not procs.is_main:
            return {}
        return {f"eval/{k}": v for k, v in summarize_records(records).items()}

    def _rollout_metrics(self, batch: RolloutBatch) -> dict[str, float]:
        lengths = np.array([len(g.token_ids) for g in batch.generations], dtype=float)
        entropy = torch.cat([g.entropy for g in batch.generations])
        correct = np.array([r.correct for r in batch.reward_results])
        return {
            "entropy": entropy.mean().item() if entropy.numel() else 0.0,
            "response_length": float(lengths.mean()),
            "response_length/correct": float(lengths[correct].mean()) if correct.any() else 0.0,
            "response_length/truncated_frac": float(np.mean([g.truncated for g in batch.generations])),
        }

    def _entropy_metrics(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """Entropy dynamics over the step's response tokens (rollout-time entropy and log-probs)."""
        mask = batch.sequences.response_mask.bool()
        low = (batch.rollout_entropy < self.cfg.logging.low_entropy_threshold) & mask
        cov = token_covariance(batch.rollout_logprobs, advantages, mask)
        n = max(1, int(mask.sum()))
        return {
            "entropy/low_frac": low.sum().item() / n,
            "entropy/cov_logp_adv": cov.sum().item() / n,
        }

    def _log(self, metrics: dict[str, float]) -> None:
        if not self.procs.is_main:
            return
        with (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(metrics) + "\n")
        if self.tb is not None:
            for key, value in metrics.items():
                if key != "step":
                    self.tb.add_scalar(key, value, metrics["step"])
            self.tb.flush()

    def _write_samples(self, batch: RolloutBatch, advantages: torch.Tensor) -> None:
        """The main process's samples and trees (its share of the batch)."""
        if not self.procs.is_main:
            return
        assert batch.rewards is not None
        trees = tree_records(
            batch, advantages, self.tokenizer, self.step, self.cfg.logging.trees_per_step, self.cfg.rose.code_compat
        )
        if trees:
            with (self.run_dir / "trees.jsonl").open("a", encoding="utf-8") as fh:
                fh.write("".join(json.dumps(t) + "\n" for t in trees))
        n = min(self.cfg.logging.samples_per_step, len(batch.texts))
        with (self.run_dir / "samples.jsonl").open("a", encoding="utf-8") as fh:
            for i in range(n):
                fh.write(
                    json.dumps(
                        {
                            "step": self.step,
                            "problem_id": batch.problems[i].id,
                            "problem": batch.problems[i].problem,
                            "gold": batch.problems[i].answer,
                            "response": batch.texts[i],
                            "answer": batch.reward_results[i].answer,
                            "reward": batch.rewards[i].item(),
                        }
                    )
                    + "\n"
                )
