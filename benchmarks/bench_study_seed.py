"""What one study seed costs, by stage, before and after the cheaper-seed work (docs/benchmarks.md,
"A study seed"): Study 2's evaluation on the chunked path against Study 3's on the continuous one.

    python benchmarks/bench_study_seed.py [--variants dr_grpo rose treepo] [--run rose] [--seed 200] [--steps 30]

Run it alone on the machine. Each variant runs in its own process, as ``semrl sweep`` runs it, and
trains once at the regime Study 2 and Study 3 share (configs/study_sparse.yaml, configs/study3.yaml:
the same training keys) for ``--steps`` steps. Its evaluations are timed three ways on the same
weights and engine, the prefix cache emptied before each:

- before: Study 2's evaluation on the chunked path (``EnginePowers.continuous_batching`` off, requests in
  chunks of the engine's batch size): the base model on 128 held-out and 128 transfer problems x 16
  samples, in the seed's first variant only (the sweep reused it for the others), and the trained
  model on the same problems;
- the chunked path's cost alone: the trained model on Study 2's problems, continuously batched (the
  first variant only);
- after: Study 3's evaluation, the trained model on 256 held-out problems x 16 samples, continuously
  batched, no base evaluation (``logging.eval_base: false``), as the trainer runs it at the last step.

Training is the same code and the same run in both columns: only the evaluation changed. Start-up is
the process's wall time less everything timed inside it (imports, the model, the vLLM engine, the
reward workers). The table gives seconds per stage and variant, the seed's total before and after,
and their ratio.

Three variants take about four hours alone, more than one sitting: each variant's times are kept in
``--records`` (one JSON per variant, with its commit and date), ``--run`` measures some variants now,
and the table is printed from the records of every variant in ``--variants``. The first of
``--variants`` is the one that carries the seed's base evaluation, whenever it runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

STUDY2, STUDY3 = "configs/study_sparse.yaml", "configs/study3.yaml"
STAGES = (
    "start-up",
    "base evaluation",
    "rollout and reward",
    "update",
    "the rest of training",
    "final evaluation",
)


SMOKE: list[str] = []  # --smoke: overrides that make every evaluation tiny


def _config(sweep_file: str, variant: str, seed: int, steps: int, out: Path) -> Any:
    from semrl.studies.sweep import load_sweep

    return load_sweep(sweep_file).variant_config(
        variant,
        [
            f"trainer.seed={seed}",
            f"trainer.steps={steps}",
            f"logging.output_dir={out}",
            "logging.eval_cache=null",
            "logging.progress=false",
            "logging.report_to=[]",
            *SMOKE,
        ],
    )


def one_variant(variant: str, seed: int, steps: int, first: bool, out: Path) -> dict[str, float]:
    """Train ``variant`` once and time its evaluations (this process; see the module docstring)."""
    from semrl.data.problem_sets import run_problems
    from semrl.evaluation import evaluate_splits
    from semrl.runtime.trainer import Trainer

    # Study 2's evaluation settings are every variant's (it had no TreePO): its Dr.GRPO config holds them
    before_cfg = _config(STUDY2, "dr_grpo", seed, steps, out / "before")
    held_out, _, transfer = run_problems(before_cfg)
    before_splits = {"eval": held_out, "transfer": transfer}
    start = time.perf_counter()
    trainer = Trainer(_config(STUDY3, variant, seed, steps, out / "after"))
    engine, times = trainer.models.engine, {"start-up: set-up": time.perf_counter() - start}

    def evaluate(name: str, continuous: bool, step: int) -> None:
        engine.powers = replace(engine.powers, continuous_batching=continuous)
        engine._reset_prefix_cache()  # every evaluation starts from an empty prefix cache
        start = time.perf_counter()
        evaluate_splits(
            engine,
            trainer.models.tokenizer,
            trainer.pool,
            before_splits,
            before_cfg,
            trainer.env.processes,
            step,
            out / name,
            trainer.rewards,
        )
        times[name] = time.perf_counter() - start
        engine.powers = replace(engine.powers, continuous_batching=True)

    if first:
        evaluate("base evaluation, chunked", False, 0)
    start = time.perf_counter()
    trainer.train()
    times["training with its final evaluation"] = time.perf_counter() - start
    rows = [json.loads(line) for line in (out / "after" / "metrics.jsonl").read_text().splitlines()]
    times["rollout and reward"] = sum(
        r["time/step_s"] - r["time/update_s"] for r in rows if "time/step_s" in r
    )
    times["update"] = sum(r["time/update_s"] for r in rows if "time/update_s" in r)
    times["final evaluation, after"] = rows[-1]["time/eval_s"]
    evaluate("final evaluation, chunked", False, steps)
    if first:
        evaluate("final evaluation, Study 2's problems continuously batched", True, steps)
    trainer.pool.close()
    return times


def _stages(t: dict[str, float], wall: float, before: bool) -> dict[str, float]:
    training = t["training with its final evaluation"] - t["final evaluation, after"]
    inside = sum(
        v
        for k, v in t.items()
        if k not in ("rollout and reward", "update", "final evaluation, after", "start-up: set-up")
    )
    return {
        "start-up": wall - inside,
        "base evaluation": t.get("base evaluation, chunked", 0.0) if before else 0.0,
        "rollout and reward": t["rollout and reward"],
        "update": t["update"],
        "the rest of training": training - t["rollout and reward"] - t["update"],
        "final evaluation": t["final evaluation, chunked"] if before else t["final evaluation, after"],
    }


def _stage_seconds(stages: dict[str, float], stage: str) -> float:
    return sum(stages.values()) if stage == "total" else stages[stage]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=["dr_grpo", "rose", "treepo"])
    parser.add_argument("--seed", type=int, default=200, help="a seed no study ran")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a variant's own process
    parser.add_argument("--first", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny evaluations: checks the script, times nothing"
    )
    parser.add_argument("--run", nargs="+", help="measure only these of --variants now (default: all)")
    parser.add_argument(
        "--records", default="benchmarks/records/study_seed", help="a JSON per variant measured"
    )
    args = parser.parse_args()
    if args.smoke:
        SMOKE.extend(["data.eval_size=4", "logging.eval_samples=2"])
    if args.one:
        out = Path(args.out)
        times = one_variant(args.one, args.seed, args.steps, args.first, out)
        (out / "times.json").write_text(json.dumps(times))
        return
    records = Path(args.records) / ("smoke" if args.smoke else f"seed-{args.seed}-steps-{args.steps}")
    records.mkdir(parents=True, exist_ok=True)
    for variant in args.run or args.variants:
        if variant not in args.variants:
            parser.error(f"--run {variant}: not one of --variants {' '.join(args.variants)}")
        first = variant == args.variants[0]
        # the code the variant's process imports: read before it starts, not after a later commit
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True
        ).stdout.strip()
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            start = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    variant,
                    "--seed",
                    str(args.seed),
                    "--steps",
                    str(args.steps),
                    "--out",
                    str(out),
                    *(["--first"] if first else []),
                    *(["--smoke"] if args.smoke else []),
                ],
                check=True,
            )
            wall = time.perf_counter() - start
            times = json.loads((out / "times.json").read_text())
        record = {
            "variant": variant,
            "seed": args.seed,
            "steps": args.steps,
            "first": first,
            "smoke": args.smoke,
            "times": times,
            "wall": wall,
            "commit": commit,
            "date": datetime.datetime.now().isoformat(timespec="minutes"),
        }
        (records / f"{variant}.json").write_text(json.dumps(record, indent=1))
        print(
            f"{variant}: {json.dumps({k: round(v, 1) for k, v in times.items()})}, wall {wall:.0f} s",
            flush=True,
        )
    kept = {
        v: json.loads((records / f"{v}.json").read_text())
        for v in args.variants
        if (records / f"{v}.json").exists()
    }
    missing = [v for v in args.variants if v not in kept]
    mismatched = [v for v, r in kept.items() if r["first"] != (v == args.variants[0])]
    if missing or mismatched:
        sys.exit(
            f"no table yet: {', '.join(missing) or 'none'} not measured, {', '.join(mismatched) or 'none'} measured "
            f"with another first variant (in {records}); measure them with --run"
        )
    before = {v: _stages(r["times"], r["wall"], True) for v, r in kept.items()}
    after = {v: _stages(r["times"], r["wall"], False) for v, r in kept.items()}
    first_times = kept[args.variants[0]]["times"]
    batching = {
        "chunked": first_times["final evaluation, chunked"],
        "continuous": first_times["final evaluation, Study 2's problems continuously batched"],
    }
    for v, r in kept.items():
        print(f"{v}: measured {r['date']} at {r['commit']}, wall {r['wall']:.0f} s")
    print(f"\nseed {args.seed}, {args.steps} steps; seconds (before / after)\n")
    print("| stage | " + " | ".join(args.variants) + " | seed before | seed after | after / before |")
    print("|---|" + "---|" * (len(args.variants) + 3))
    for stage in (*STAGES, "total"):
        b = {v: _stage_seconds(before[v], stage) for v in args.variants}
        a = {v: _stage_seconds(after[v], stage) for v in args.variants}
        cells = [f"{b[v]:.0f} / {a[v]:.0f}" for v in args.variants]
        seed_before, seed_after = sum(b.values()), sum(a.values())
        ratio = f"{seed_after / seed_before:.2f}x" if seed_before else "-"
        print(f"| {stage} | " + " | ".join(cells) + f" | {seed_before:.0f} | {seed_after:.0f} | {ratio} |")
    print(
        f"\n{args.variants[0]}'s final evaluation on Study 2's problems: chunked {batching['chunked']:.0f} s, "
        f"continuously batched {batching['continuous']:.0f} s "
        f"({batching['continuous'] / batching['chunked']:.2f}x)"
    )


if __name__ == "__main__":
    main()
