"""The update's achieved GFLOP/s against this CPU's sgemm peak, measured in the same run: is the
update where a study seed can get cheaper?

    python benchmarks/bench_update_flops.py [--variant dr_grpo] [--repeats 3]
        [--try trainer.micro_batch_size=16 trainer.logits_chunk_size=1024 ...] [--threads 1 2] [--compile]

One rollout batch of Study 3's regime (configs/study3.yaml: SmolLM2-135M on the vllm engine, 8
prompts x 8 samples of at most 64 new tokens, two mini-batches of 32, micro-batches of 8) is
sampled, again until a group's rewards differ (a gradient that is not zero). The training side of a
step then runs as the trainer runs it (the no-gradient passes, the advantages, the PPO update:
``time/update_s`` less the weight sync) from the same weights and optimizer state, ``--repeats``
times per case, the cases alternated; the table gives the median.

Its floating-point operations are counted once per case by ``torch.utils.flop_counter`` (the matrix
products and attention, forward and backward, as executed: padding included, the LM head's chunks
included). The peak is the best of 20 float32 matrix products of 2048 x 2048 and 6 of 4096 x 4096
on the same threads, in the same process, after the timed runs. ``--try`` adds cases (overrides of
the ``trainer`` section, one per word, each measured on its own); ``--threads`` runs every case at
each thread count. ``--compile`` then compiles every decoder layer's forward with ``torch.compile``
(inductor, dynamic shapes; the compilation in a warm-up run, not timed), times it alternated with
eager, and compares the first optimizer step's micro-batch losses and gradients (before clipping)
with eager's on the same batch, against a stated tolerance.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import tempfile
import time
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from semrl.config.load import load_config
from semrl.config.sections import Config
from semrl.rollout.batch import CollectedStep
from semrl.runtime.trainer import Trainer
from semrl.studies.sweep import load_sweep


def sgemm_peak() -> float:
    """Best float32 matrix-product GFLOP/s on the current threads."""
    best = 0.0
    for n in (2048, 4096):
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)  # warm-up
        for _ in range(20 if n == 2048 else 6):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return best


def with_trainer_setting(cfg: Config, setting: str) -> Config:
    """``cfg`` with one ``trainer.key=value`` override (validated by load_config's own parser)."""
    key, _, value = setting.partition("=")
    section, _, name = key.partition(".")
    if section != "trainer" or not name:
        raise SystemExit(f"--try takes trainer.KEY=VALUE overrides, not '{setting}'")
    probe = load_config("configs/demo.yaml", [setting])
    return dataclasses.replace(
        cfg, trainer=dataclasses.replace(cfg.trainer, **{name: getattr(probe.trainer, name)})
    )


def _timed_update(
    trainer: Trainer, collected: CollectedStep, weights: dict[str, torch.Tensor], optim: dict[str, Any]
) -> float:
    """Seconds of one training side from ``weights`` and ``optim``."""
    trainer.models.model.load_state_dict(weights)
    trainer.run.optim.optimizer.load_state_dict(optim)
    t0 = time.perf_counter()
    trainer.learn(collected.batch, collected.scores)
    return time.perf_counter() - t0


def first_step_gradients(
    trainer: Trainer, collected: CollectedStep, weights: dict[str, torch.Tensor], optim: dict[str, Any]
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The first optimizer step's micro-batch losses and its gradients before clipping, from
    ``weights`` and ``optim``."""
    optimization, original = trainer.actor.optim, trainer.actor.optim.step
    losses: list[float] = []
    grads: dict[str, torch.Tensor] = {}

    def capture(step_losses: list[float]) -> tuple[float, bool]:
        if not grads:
            losses.extend(step_losses)
            grads.update(
                {
                    name: p.grad.detach().clone()
                    for name, p in trainer.models.model.named_parameters()
                    if p.grad is not None
                }
            )
        return original(step_losses)

    optimization.step = capture  # type: ignore[method-assign, assignment]  # an instance attribute, removed below
    try:
        _timed_update(trainer, collected, weights, optim)
    finally:
        del optimization.step
    return losses, grads


GRADIENT_TOLERANCE = 1e-3  # relative to the largest eager gradient: float32 sums in another order


def compiled_rows(
    trainer: Trainer,
    collected: CollectedStep,
    weights: dict[str, torch.Tensor],
    optim: dict[str, Any],
    repeats: int,
) -> None:
    """Every decoder layer's forward compiled against eager, alternated, and the compiled update's
    losses and gradients against eager's on the same batch."""
    layers: list[torch.nn.Module] = list(trainer.models.model.model.layers)  # type: ignore[union-attr, arg-type]
    compiled = [torch.compile(layer.forward, dynamic=True) for layer in layers]

    def use(compile_: bool) -> None:
        for layer, forward in zip(layers, compiled, strict=True):
            if compile_:
                layer.forward = forward
            elif "forward" in vars(layer):
                del layer.forward

    use(True)
    warm_up = _timed_update(trainer, collected, weights, optim)  # compiles
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for compile_ in (False, True):
            use(compile_)
            seconds[compile_].append(_timed_update(trainer, collected, weights, optim))
    compiled_losses, compiled_grads = first_step_gradients(trainer, collected, weights, optim)
    use(False)
    eager_losses, eager_grads = first_step_gradients(trainer, collected, weights, optim)
    largest = max(float(g.abs().max()) for g in eager_grads.values())
    if largest == 0:
        raise SystemExit("the eager update's gradient is zero: this batch cannot compare gradients")
    gap = max(float((compiled_grads[k] - eager_grads[k]).abs().max()) for k in eager_grads) / largest
    loss_gap = max(abs(c - e) for c, e in zip(compiled_losses, eager_losses, strict=True))
    eager, fast = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(
        f"\ncompiled decoder layers (inductor, dynamic shapes), alternated with eager, median of {repeats}: "
        f"eager {eager:.2f} s, compiled {fast:.2f} s ({eager / fast:.2f}x); compilation's warm-up run "
        f"{warm_up:.0f} s"
    )
    print(
        f"first optimizer step, compiled against eager: micro-batch losses at most {loss_gap:.2e} apart; "
        f"gradients at most {gap:.2e} of the largest eager gradient ({largest:.2e}): "
        f"{'within' if gap <= GRADIENT_TOLERANCE else 'OUTSIDE'} the tolerance {GRADIENT_TOLERANCE:g}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", default="configs/study3.yaml")
    parser.add_argument("--variant", default="dr_grpo")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--try", dest="settings", nargs="*", default=[])
    parser.add_argument("--threads", type=int, nargs="*", default=[torch.get_num_threads()])
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    sweep = load_sweep(args.sweep)
    with tempfile.TemporaryDirectory() as out:
        cfg = sweep.variant_config(
            args.variant,
            [
                f"trainer.seed={sweep.seeds[0]}",
                f"logging.output_dir={out}/run",
                f"logging.eval_cache={out}/cache",
                "data.eval=null",
                "logging.progress=false",
                "logging.report_to=[]",
            ],
        )
        trainer = Trainer(cfg)
        for _ in range(10):  # a batch with a gradient: a group whose rewards differ
            collected = trainer.collect()
            if bool(trainer.advantages(collected.batch, collected.scores)[0].any()):
                break
        trainer.models.engine.release_memory()
        tokens = int(collected.batch.sequences.response_mask.sum())
        weights = copy.deepcopy(trainer.models.model.state_dict())
        optim = copy.deepcopy(trainer.run.optim.optimizer.state_dict())
        configs = {
            setting: cfg if setting == "as configured" else with_trainer_setting(cfg, setting)
            for setting in ["as configured", *args.settings]
        }
        cases = [(threads, setting) for threads in args.threads for setting in configs]
        gflop: dict[tuple[int, str], float] = {}
        for threads, setting in cases:  # counted once each; also the warm-up
            torch.set_num_threads(threads)
            trainer.actor.cfg = configs[setting]
            trainer.models.model.load_state_dict(weights)
            trainer.run.optim.optimizer.load_state_dict(optim)
            with FlopCounterMode(display=False) as counter:
                trainer.learn(collected.batch, collected.scores)
            gflop[threads, setting] = counter.get_total_flops() / 1e9
        seconds: dict[tuple[int, str], list[float]] = {case: [] for case in cases}
        for _ in range(args.repeats):  # alternated, so that a drift in the machine reaches every case
            for threads, setting in cases:
                torch.set_num_threads(threads)
                trainer.actor.cfg = configs[setting]
                seconds[threads, setting].append(_timed_update(trainer, collected, weights, optim))
        peaks = {}
        for threads in args.threads:
            torch.set_num_threads(threads)
            peaks[threads] = sgemm_peak()
        print(
            f"{args.variant}, {len(collected.batch.generations)} rows, {tokens} response tokens; median of "
            f"{args.repeats} alternated runs per case\n"
        )
        print(
            "| setting | threads | seconds | vs configured | GFLOP | GFLOP/s | sgemm peak GFLOP/s | of peak |"
        )
        print("|---|---|---|---|---|---|---|---|")
        base = statistics.median(seconds[args.threads[0], "as configured"])
        for threads, setting in cases:
            median, flops = statistics.median(seconds[threads, setting]), gflop[threads, setting]
            print(
                f"| {setting} | {threads} | {median:.2f} | {base / median:.2f}x | {flops:.0f} | "
                f"{flops / median:.0f} | {peaks[threads]:.0f} | {flops / median / peaks[threads]:.0%} |"
            )
        if args.compile:
            torch.set_num_threads(args.threads[0])
            trainer.actor.cfg = cfg
            compiled_rows(trainer, collected, weights, optim, args.repeats)
        trainer.pool.close()


if __name__ == "__main__":
    main()
