"""What a vLLM engine in the process adds to the update (issue 89, item 2): one demo batch, the same
update timed by phase without vLLM, with it started, and without it again.

    python benchmarks/bench_update_engines.py [--repeats 3] [--set model.dtype=float32 ...]

The demo's Trainer on the hf engine samples one batch (seeded); then the update of that batch
(``Trainer.learn``: advantages, the no-gradient passes, forwards, backwards, the optimizer) runs
``--repeats`` times from the same weights and optimizer state, restored before each. Then vLLM
starts in the process (compiled, as the demo's engine) and the same updates run again, each followed
by the weight sync to vLLM; then vLLM is shut down and the updates run a third time, so a drift of the
machine shows as a difference between the first and the third. Prints one JSON line per update and a
Markdown table of the phases' medians.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time

from semrl.config.load import load_config
from semrl.core.timing import PhaseClock
from semrl.rollout.engines import build_engine
from semrl.runtime.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], help="config overrides (section.key=value)")
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="bench-update-")
    cfg = load_config(
        "demo",
        [
            "data.eval=null",
            "rollout.engine=hf",
            f"logging.output_dir={out}",
            "logging.report_to=[]",
            *args.set,
        ],
    )
    trainer = Trainer(cfg)
    collected = trainer.collect()
    batch, scores = collected.batch, collected.scores
    weights = copy.deepcopy(trainer.models.model.state_dict())
    optimizer = copy.deepcopy(trainer.run.optim.optimizer.state_dict())
    scheduler = copy.deepcopy(trainer.run.optim.scheduler.state_dict())
    generator = trainer.env.generator.get_state()
    rows: list[dict[str, float | str]] = []

    def updates(label: str, engine: object | None) -> None:
        for k in range(args.repeats):
            trainer.models.model.load_state_dict(weights)
            trainer.run.optim.optimizer.load_state_dict(optimizer)
            trainer.run.optim.scheduler.load_state_dict(scheduler)
            trainer.env.generator.set_state(generator)
            clock = PhaseClock()
            start = time.perf_counter()
            trainer.learn(batch, scores, clock)
            if engine is not None:
                with clock.phase("sync"):
                    engine.sync_weights()  # type: ignore[attr-defined]
            row = {"engine": label, "repeat": k, "update_s": time.perf_counter() - start, **clock.seconds}
            rows.append(row)
            print(json.dumps(row), flush=True)

    updates("hf, before", None)
    started = time.perf_counter()
    r = cfg.rollout
    vllm = build_engine(
        "vllm",
        trainer.models.model,  # type: ignore[arg-type]
        trainer.models.tokenizer,
        r.prompts_per_step * r.group_size,
        cfg.data.max_prompt_length + r.max_new_tokens,
        r.logprobs_top_k,
        cfg.trainer.seed,
        r,
        compute_dtype=trainer.models.precision.compute,
    )
    print(json.dumps({"vllm_start_s": time.perf_counter() - started}), flush=True)
    updates("vllm in the process", vllm)
    from semrl.rollout.engines.vllm.start import shutdown_engines

    shutdown_engines()
    updates("hf, after", None)
    phases = ["update_s", "advantages", "forward", "backward", "optimizer", "sync"]
    print("\n| | " + " | ".join(phases) + " |\n|---|" + "---|" * len(phases))
    for label in dict.fromkeys(str(row["engine"]) for row in rows):
        mine = [row for row in rows if row["engine"] == label]
        cells = [
            f"{statistics.median(float(row.get(p, 0.0)) for row in mine):.2f}"
            + f" ({min(float(row.get(p, 0.0)) for row in mine):.2f}-{max(float(row.get(p, 0.0)) for row in mine):.2f})"
            for p in phases
        ]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
