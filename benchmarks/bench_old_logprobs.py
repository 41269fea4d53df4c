"""The first mini-batch's old log-probs from its own forward, against a separate no-gradient pass, in
one run: the training side of a study step (SmolLM2-135M, 8 prompts x 8 samples x 64 tokens, two
mini-batches of 32, micro-batches of 8; configs/study_arith.yaml's shape).

    python benchmarks/bench_old_logprobs.py [--engine vllm] [--repeats 3]

One rollout batch is sampled once; then, alternated ``--repeats`` times from the same weights and
optimizer state, the no-gradient passes + advantages + update run with ``Actor.reuse_first_forward``
off (``separate``: every row in the old-policy pass) and on (``reused``). Both give bit-identical
weights (tests/runtime/test_training.py); the table gives the median seconds and their ratio, the
spread of the ratio over the alternated pairs (each repeat's separate over its reused, min-max), and
the rollout's seconds once, for the whole step.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

from semrl.config.load import load_config
from semrl.rollout.batch import CollectedStep
from semrl.runtime.trainer import Trainer


def _train_side(trainer: Trainer, collected: CollectedStep, reuse: bool) -> float:
    trainer.actor.reuse_first_forward = reuse
    t0 = time.perf_counter()
    trainer.learn(collected.batch, collected.scores)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["hf", "vllm"], default="vllm")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=["dr_grpo", "grpo"])
    args = parser.parse_args()
    print(
        "| method | rollout (s) | separate pass (s) | reused (s) | train side ratio | pairs' ratios | step ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for method in args.methods:
        with tempfile.TemporaryDirectory() as out:
            cfg = load_config(
                "configs/demo.yaml",
                [
                    f"rollout.engine={args.engine}",
                    "data.arithmetic_levels=[1,4]",
                    "data.eval=null",
                    "trainer.mini_batch_size=32",
                    "trainer.micro_batch_size=8",
                    "trainer.lr=2e-5",
                    f"algorithm.method={method}",
                    f"algorithm.kl_coef={0.001 if method == 'grpo' else 0.0}",
                    f"logging.output_dir={out}/run",
                    "logging.progress=false",
                    "logging.report_to=[]",
                ],
            )
            trainer = Trainer(cfg)
            t0 = time.perf_counter()
            collected = trainer.collect()
            rollout = time.perf_counter() - t0
            weights = copy.deepcopy(trainer.models.model.state_dict())
            optim = copy.deepcopy(trainer.run.optim.optimizer.state_dict())
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.repeats):
                for reuse in (False, True):
                    trainer.models.model.load_state_dict(weights)
                    trainer.run.optim.optimizer.load_state_dict(optim)
                    times[reuse].append(_train_side(trainer, collected, reuse))
            trainer.pool.close()
            sep, reu = statistics.median(times[False]), statistics.median(times[True])
            pairs = [a / b for a, b in zip(times[False], times[True], strict=True)]
            print(
                f"| {method} | {rollout:.1f} | {sep:.1f} | {reu:.1f} | {sep / reu:.2f}x | "
                f"{min(pairs):.2f}-{max(pairs):.2f}x | {(rollout + sep) / (rollout + reu):.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
