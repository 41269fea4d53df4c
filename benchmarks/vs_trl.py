"""semrl vs TRL's GRPOTrainer, side by side on the same work (CPU).

    pip install "trl==1.16.0" datasets        # benchmark-only, not a semrl dependency
    python benchmarks/vs_trl.py --model smollm2-135m --steps 3 --repeats 2
    python benchmarks/vs_trl.py --model tiny --steps 4 --repeats 3

Same model, same procedural arithmetic prompts (1-digit sums), same system prompt and chat
template, 8 prompts x G = 8 per optimizer step, 64 new tokens at T = 1.0, Dr.GRPO loss (no std
scaling, no KL), lr 1e-5, one optimizer step per rollout batch. Each run is its own process;
TRL and semrl alternate, ``--repeats`` times. TRL runs with its defaults otherwise (gradient
checkpointing on; ``--trl-no-gradient-checkpointing`` turns it off). The first step of every run
is a warm-up and is not counted. Prints the median time per step of each and the ratio.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
PROMPTS, GROUP, NEW_TOKENS, LR = 8, 8, 64, 1e-5


def _tiny_model(cache: Path) -> str:
    """A random ~3M-parameter Llama with SmolLM2's tokenizer: the test suite's (tests/helpers.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
    from tests.helpers import build_tiny_model

    return str(build_tiny_model(cache / "tiny-llama"))


def _model_path(name: str) -> str:
    from semrl.models.loading import resolve_model_path

    if name == "tiny":
        return _tiny_model(Path(tempfile.gettempdir()) / "semrl-bench")
    return resolve_model_path(name)


def _problems(steps: int) -> list:
    from semrl.data import make_arithmetic_problems

    return make_arithmetic_problems(PROMPTS * steps, [1], seed=0)


def run_trl(model: str, steps: int, gradient_checkpointing: bool) -> list[float]:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    problems = _problems(steps)
    data = Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": p.problem},
                ],
                "answer": p.answer,
            }
            for p in problems
        ]
    )

    def reward(completions: list, answer: list[str], **_: object) -> list[float]:
        out = []
        for completion, gold in zip(completions, answer, strict=True):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
            numbers = re.findall(r"-?\d+", text)
            guess = boxed[-1].strip() if boxed else (numbers[-1] if numbers else None)
            out.append(1.0 if guess == gold else 0.0)
        return out

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args: object, **kwargs: object) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *args: object, **kwargs: object) -> None:
            times.append(time.perf_counter() - self.start)

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            num_generations=GROUP,
            per_device_train_batch_size=PROMPTS * GROUP,
            gradient_accumulation_steps=1,
            max_completion_length=NEW_TOKENS,
            temperature=1.0,
            loss_type="dr_grpo",
            scale_rewards="none",
            beta=0.0,
            learning_rate=LR,
            bf16=False,
            use_cpu=True,
            logging_steps=1,
            use_vllm=False,
            report_to="none",
            max_steps=steps,
            save_strategy="no",
            seed=0,
            gradient_checkpointing=gradient_checkpointing,
            shuffle_dataset=False,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=data,
            processing_class=AutoTokenizer.from_pretrained(model),
            callbacks=[StepTimer()],
        )
        trainer.train()
    return times


def run_semrl(model: str, steps: int, packing: str, engine: str = "hf") -> list[float]:
    from semrl.config.load import load_config
    from semrl.runtime.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(
            None,
            [
                f"model.name={model}",
                "data.train=arithmetic",
                "data.eval=null",
                "data.arithmetic_levels=[1]",
                f"data.system_prompt={SYSTEM_PROMPT}",
                f"rollout.group_size={GROUP}",
                f"rollout.prompts_per_step={PROMPTS}",
                f"rollout.max_new_tokens={NEW_TOKENS}",
                "rollout.temperature=1.0",
                "algorithm.method=dr_grpo",
                "algorithm.kl_coef=0.0",
                f"trainer.lr={LR}",
                f"trainer.steps={steps}",
                "trainer.micro_batch_size=8",
                f"trainer.packing={packing}",
                f"logging.output_dir={out}/run",
                "logging.progress=false",
                "logging.tensorboard=false",
                f"rollout.engine={engine}",
            ],
        )
        Trainer(cfg).train()
        rows = [json.loads(line) for line in Path(out, "run", "metrics.jsonl").read_text().splitlines()]
    return [r["time/step_s"] for r in rows if "time/step_s" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="'smollm2-135m', 'tiny' or a model directory")
    parser.add_argument("--steps", type=int, default=3, help="steps per run; the first is not counted")
    parser.add_argument("--repeats", type=int, default=2, help="alternating TRL / semrl runs of each")
    parser.add_argument("--trl-no-gradient-checkpointing", action="store_true")
    parser.add_argument("--packing", default="none", choices=["none", "tree"], help="semrl's trainer.packing")
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="semrl's rollout.engine")
    parser.add_argument("--worker", choices=["trl", "semrl"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = _model_path(args.model)
    if args.worker == "trl":
        print(json.dumps(run_trl(model, args.steps, not args.trl_no_gradient_checkpointing)))
        return
    if args.worker == "semrl":
        print(json.dumps(run_semrl(model, args.steps, args.packing, args.engine)))
        return
    steps: dict[str, list[float]] = {"trl": [], "semrl": []}
    for rep in range(args.repeats):
        for name in ("trl", "semrl"):
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                name,
                "--model",
                args.model,
                "--steps",
                str(args.steps),
                "--packing",
                args.packing,
                "--engine",
                args.engine,
            ]
            if args.trl_no_gradient_checkpointing:
                cmd.append("--trl-no-gradient-checkpointing")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            times = json.loads(out.strip().splitlines()[-1])
            print(f"repeat {rep} {name}: " + ", ".join(f"{t:.1f}" for t in times) + " s/step", flush=True)
            steps[name].extend(times[1:])
    trl, semrl = statistics.median(steps["trl"]), statistics.median(steps["semrl"])
    gc = "off" if args.trl_no_gradient_checkpointing else "on (its default)"
    print(f"\n| model | TRL GRPOTrainer s/step (GC {gc}) | semrl s/step | semrl / TRL |")
    print("|---|---|---|---|")
    print(f"| {args.model} | {trl:.2f} | {semrl:.2f} | **{semrl / trl:.2f}** |")


if __name__ == "__main__":
    main()
