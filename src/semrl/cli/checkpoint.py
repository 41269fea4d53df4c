"""``semrl checkpoint verify``: check a run's checkpoints against their manifests."""

from __future__ import annotations

import argparse
from pathlib import Path

from semrl.cli.common import SubParsers
from semrl.errors import ConfigError


def add_parser(sub: SubParsers) -> None:
    ck = sub.add_parser(
        "checkpoint",
        help="verify a run's checkpoints",
        description="verify: check every checkpoint of a run (and its curriculum references) against its "
        "manifest (file sizes and SHA-256); exit 1 if one is damaged.",
    )
    ck.add_argument("checkpoint_command", choices=["verify"])
    ck.add_argument("run_dir", help="run directory (logging.output_dir)")
    ck.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not Path(args.run_dir).is_dir():
        raise ConfigError(f"no run directory '{args.run_dir}'; give the logging.output_dir of a run")
    from semrl.runtime.checkpoint import list_checkpoints, verify_checkpoint
    from semrl.runtime.run_state import stage_reference_dirs

    run_dir = Path(args.run_dir)
    references = [c for stage in stage_reference_dirs(run_dir) for c in list_checkpoints(stage)]
    found = list_checkpoints(run_dir) + references
    if not found:
        raise ConfigError(f"no checkpoints in {run_dir / 'checkpoints'}")
    bad = 0
    for ckpt in found:
        problems = verify_checkpoint(ckpt)
        bad += bool(problems)
        print(f"{ckpt}: " + ("OK" if not problems else "DAMAGED\n    " + "\n    ".join(problems)))
    print(f"{len(found) - bad} of {len(found)} checkpoints valid")
    return 1 if bad else 0
