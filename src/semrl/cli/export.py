"""``semrl export``: a run's trained model as one Hugging Face model directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from semrl.cli.common import SubParsers
from semrl.errors import ConfigError


def add_parser(sub: SubParsers) -> None:
    ex = sub.add_parser(
        "export",
        help="write a run's trained model as one Hugging Face model directory",
        description="The newest valid checkpoint (or --checkpoint) as a directory that "
        "AutoModelForCausalLM.from_pretrained loads: LoRA adapters merged into the run's base model, "
        "no trainer state.",
    )
    ex.add_argument("run_dir", help="run directory (logging.output_dir)")
    ex.add_argument("--checkpoint", help="checkpoint directory (default: the newest valid one of RUN_DIR)")
    ex.add_argument("--output", help="a new directory (default RUN_DIR/export)")
    ex.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not Path(args.run_dir).is_dir():
        raise ConfigError(f"no run directory '{args.run_dir}'; give the logging.output_dir of a finished run")
    from semrl.runtime.export import export_model

    output = export_model(
        Path(args.run_dir),
        Path(args.output) if args.output else None,
        Path(args.checkpoint) if args.checkpoint else None,
    )
    print(f"wrote {output} (load it with AutoModelForCausalLM.from_pretrained)")
    return 0
