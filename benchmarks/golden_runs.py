"""Golden runs: every method for 2 steps on two tiny models, final weights and every metric, to show
that a refactor leaves behaviour bit-identical.

    python benchmarks/golden_runs.py --output before.json          # on the old code
    python benchmarks/golden_runs.py --output after.json --compare before.json
    python benchmarks/golden_runs.py --engine vllm ...   # the same runs sampled by vLLM (head dim 32 only)

Each run records the sha256 of every final weight tensor and every logged metric except timings;
``--compare`` lists the runs, metrics and tensors that differ and exits 1 when any does.

The runs share one process, and glibc's adaptive mmap threshold makes where a large tensor lands (on
a page, or 64 bytes into the heap) depend on what the earlier runs allocated and freed; the CPU's
float32 matrix products round differently by alignment. So the script runs under a fixed threshold
(``MALLOC_MMAP_THRESHOLD_``, restarting itself with it). Without it, issue 91's changes, which
change no computation, changed the last bits of the 19 head-dim-32 runs on hf (float32 metrics in the
7th digit), while all 38 runs agreed bit for bit with the code before under the fixed threshold
(2026-12-06, 2-core Intel Xeon).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]  # this checkout's code, also from a worktree

from tests.helpers import (  # noqa: E402 (the repository root first)
    build_tiny_model,
    pretrain_digits,
    tiny_run_overrides,
    write_seven_task,
)
from tests.method_runs import tiny_runs  # noqa: E402

# every registered method's tiny run (tests/method_runs.py, the table the resume test trains too), and
# variants
RUNS: dict[str, list[str]] = tiny_runs(
    rose_code=[
        "algorithm.method=rose",
        "rollout.max_new_tokens=6",
        "rose.code_compat=true",
        "rose.alpha=1.0",
    ],
    treepo_paper_options=[
        "algorithm.method=treepo",
        "rollout.max_new_tokens=6",
        "treepo.segment_length=2",
        "treepo.stop_on_boxed=true",
        "treepo.subtract_batch_mean=false",
        "treepo.weight=group_size",
        "treepo.drop_zero_std_subgroups=true",
        "treepo.first_branch_max=4",
    ],
    latr_dapo_math=[
        "algorithm.method=latr",
        "latr.host=dapo",
        "rollout.max_new_tokens=6",
        "latr.lookahead=[2]",
        "latr.tau_abs=0.02",
        "latr.tau_rel=0.9",
        "latr.edit_distance_threshold=null",
        "latr.suffix_match_threshold=0.2",
        "latr.rouge_l_threshold=0.5",
        "algorithm.dynamic_sampling=true",
    ],
    entropy_bonus=["algorithm.method=grpo", "algorithm.entropy_coeff=0.01", "algorithm.kl_coef=0.001"],
    entropy_bonus_adaptive=[
        "algorithm.entropy_coeff=0.02",
        "algorithm.entropy_target=1.0",
        "trainer.mini_batch_size=16",
    ],
    # a 2-stage curriculum (scores written below), and one that restarts the optimizer and reference
    sent_curriculum=["algorithm.method=sent", "data.curriculum_stages=2", "trainer.ppo_epochs=2"],
    grpo_curriculum_reset=[
        "algorithm.method=grpo",
        "algorithm.kl_coef=0.01",
        "data.curriculum_stages=2",
        "data.curriculum_reset_optimizer=true",
        "logging.save_every=1",
    ],
)
CURRICULUM_RUNS = ("sent_curriculum", "grpo_curriculum_reset")


def _digest(path: Path) -> dict[str, str]:
    from safetensors.torch import load_file

    return {
        k: hashlib.sha256(v.float().numpy().tobytes()).hexdigest()[:16]
        for k, v in sorted(load_file(path).items())
    }


def _run(name: str, model_dir: Path, task: Path, out: Path, engine: str = "hf") -> dict[str, object]:
    from semrl.config.load import load_config
    from semrl.runtime.trainer import Trainer

    extra = []
    if name in CURRICULUM_RUNS:
        rows = [json.loads(line) for line in task.read_text().splitlines()]
        curriculum = task.with_name("curriculum.jsonl")
        curriculum.write_text(
            "".join(
                json.dumps({**r, "semantic_entropy": (i * 7) % 11 / 10}) + "\n" for i, r in enumerate(rows)
            )
        )
        extra.append(f"data.curriculum={curriculum}")
    cfg = load_config(
        None,
        tiny_run_overrides(
            model_dir,
            task,
            out,
            f"data.eval={task}",
            "data.eval_size=4",
            "trainer.steps=2",
            "logging.eval_samples=2",
            "logging.report_to=[]",
            f"rollout.engine={engine}",
            # vLLM's default, compiled, which users run (the tests' tiny run sets it eager)
            "rollout.vllm_enforce_eager=false",
            *RUNS[name],
            *extra,
        ),
    )
    trainer = Trainer(cfg)
    try:
        trainer.train()
    finally:
        trainer.env.processes.close()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    metrics = [
        {k: v for k, v in r.items() if not k.startswith("time/") and "time_frac" not in k} for r in rows
    ]
    return {"metrics": metrics, "weights": _digest(out / "checkpoints" / "step-000002" / "model.safetensors")}


ADDED: set[str] = set()
ADDED_OK = False


def _differences(before: dict, after: dict) -> list[str]:
    found = []
    for run in sorted(set(before) | set(after)):
        if run not in before or run not in after:
            found.append(f"{run}: only in {'after' if run in after else 'before'}")
            continue
        a, b = before[run], after[run]
        for step, (ra, rb) in enumerate(zip(a["metrics"], b["metrics"], strict=False)):
            for key in sorted(set(ra) | set(rb)):
                if key not in ra and ADDED_OK:
                    ADDED.add(key)  # a metric the new code logs in addition: reported, not a difference
                elif ra.get(key) != rb.get(key):
                    found.append(f"{run} row {step} {key}: {ra.get(key)} -> {rb.get(key)}")
        if len(a["metrics"]) != len(b["metrics"]):
            found.append(f"{run}: {len(a['metrics'])} metric rows -> {len(b['metrics'])}")
        found += [
            f"{run} weight {k}"
            for k in sorted(set(a["weights"]) | set(b["weights"]))
            if a["weights"].get(k) != b["weights"].get(k)
        ]
    return found


def main() -> int:
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # glibc reads it at start-up only (see above)
        environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        os.execve(sys.executable, [sys.executable, *sys.argv], environment)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", type=Path, required=True, help="JSON file for this code's results")
    parser.add_argument("--compare", type=Path, help="a previous --output to compare with")
    parser.add_argument("--runs", nargs="*", default=list(RUNS), help="a subset of the runs")
    parser.add_argument(
        "--engine",
        choices=["hf", "vllm"],
        default="hf",
        help="the rollout engine; vllm runs the head-dim-32 model only (vLLM's CPU attention needs it)",
    )
    parser.add_argument(
        "--allow-new-metrics",
        action="store_true",
        help="metrics only the new code logs are listed, not differences",
    )
    args = parser.parse_args()
    global ADDED_OK
    ADDED_OK = args.allow_new_metrics
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        task = write_seven_task(root / "seven.jsonl")
        tiny = build_tiny_model(root / "tiny")
        models = {
            "hd32": pretrain_digits(build_tiny_model(root / "tiny32", hidden_size=128), root / "digits32")
        }
        if args.engine == "hf":
            models = {"hd16": pretrain_digits(tiny, root / "digits"), **models}
        for model, model_dir in models.items():
            for name in args.runs:
                print(f"{model}/{name}", flush=True)
                results[f"{model}/{name}"] = _run(
                    name, model_dir, task, root / "runs" / model / name, args.engine
                )
    args.output.write_text(json.dumps(results, indent=1, sort_keys=True))
    print(f"{len(results)} runs -> {args.output}")
    if args.compare:
        found = _differences(json.loads(args.compare.read_text()), results)
        if ADDED:
            print(f"metrics logged in addition: {', '.join(sorted(ADDED))}")
        print("\n".join(found) if found else f"bit-identical to {args.compare}: {len(results)} runs")
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
