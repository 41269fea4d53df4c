"""``semrl train``: one run from a YAML config plus overrides, on one or several processes."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from semrl.cli.common import SubParsers, add_plugin_arg, load_plugins_of
from semrl.errors import ConfigError, Interrupted


def add_parser(sub: SubParsers) -> None:
    train = sub.add_parser(
        "train",
        help="train a model",
        description="Train with a YAML config plus section.key=value overrides, e.g. "
        "'semrl train --config configs/demo.yaml trainer.lr=2e-6'.",
    )
    train.add_argument("--config", help="YAML config file (see 'semrl config' for every key)")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    train.add_argument(
        "--num-processes",
        type=int,
        default=1,
        metavar="N",
        help="data-parallel processes on this machine, started through 'accelerate launch' (gloo on CPU, "
        "NCCL on GPUs); the same as 'accelerate launch --multi_gpu --num_processes N -m semrl train ...'",
    )
    add_plugin_arg(train)
    train.add_argument("overrides", nargs="*", help="section.key=value overrides")
    train.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.num_processes != 1:
        return _launch(args)
    load_plugins_of(args)
    from semrl.config.load import load_config

    if args.resume:
        run_dir = Path(args.resume)
        _check_run_dir(run_dir)
        cfg = load_config(
            args.config or run_dir / "config.yaml", [*args.overrides, f"logging.output_dir={run_dir}"]
        )
    else:
        cfg = load_config(args.config, args.overrides)
    from semrl.core.collector import imports_collected_once

    with imports_collected_once():  # torch, transformers and the trainer, frozen once loaded
        from semrl.runtime.trainer import Trainer
        from semrl.tracking.run_summary import summary_of_run

    run_dir = Path(cfg.logging.output_dir)
    new_dir = not run_dir.exists()
    try:
        trainer = Trainer(cfg, resume=bool(args.resume))
    except KeyboardInterrupt:  # the run's own handler starts with training (semrl.runtime.preemption)
        removed = new_dir and _remove_new_run_dir(run_dir)
        raise Interrupted.while_loading(run_dir, bool(args.resume), removed) from None
    try:
        trainer.train()
    except BaseException:
        trainer.env.processes.close(wait_for_others=False)  # another process may never reach a barrier
        raise
    trainer.env.processes.close()
    if not trainer.env.processes.is_main:
        return 0
    print("\n" + summary_of_run(cfg.logging.output_dir))
    return 0


def _remove_new_run_dir(run_dir: Path) -> bool:
    """Remove the run directory this command made (a run stopped while loading: its config, a
    tracker's empty logs), so that no try leaves one behind and the same command starts again."""
    import shutil

    if not run_dir.is_dir():
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return not run_dir.exists()


def _check_run_dir(run_dir: Path) -> None:
    """``--resume RUN_DIR`` names a run directory, before anything heavy loads."""
    if not run_dir.is_dir():
        raise ConfigError(
            f"--resume: no run directory '{run_dir}'; give the logging.output_dir of the run to continue"
        )
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(
            f"--resume: '{run_dir}' holds no config.yaml, so it is not a semrl run directory (one that "
            "'semrl train' wrote); give the run's logging.output_dir"
        )


def free_port() -> int:
    """A TCP port that no process listens on now (the kernel's pick)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def accelerate_launch(num_processes: int, port: str) -> list[str]:
    """``accelerate launch`` for ``num_processes`` processes on this machine, rendezvous on
    ``port``; the script or ``-m module`` and its arguments go after it."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(num_processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        port,
    ]


def _launch(args: argparse.Namespace) -> int:
    """Re-run this ``semrl train`` command in ``args.num_processes`` processes through accelerate."""
    import subprocess

    if args.num_processes < 1:
        raise ConfigError(f"--num-processes must be >= 1, got {args.num_processes}")
    # a bad config fails here, once, instead of in every process
    load_plugins_of(args)
    from semrl.config.load import load_config

    if args.resume:
        _check_run_dir(Path(args.resume))
    config_file = args.config or (Path(args.resume) / "config.yaml" if args.resume else None)
    cfg = load_config(config_file, args.overrides)
    # every process writes to the one run directory chosen here, also where it is chosen by the clock
    overrides = [*args.overrides, *([] if args.resume else [f"logging.output_dir={cfg.logging.output_dir}"])]
    # a free port rather than torch's fixed 29500: two runs on one machine do not collide
    port = os.environ.get("MASTER_PORT") or str(free_port())
    command = [*accelerate_launch(args.num_processes, port), "-m", "semrl", "train"]
    command += ["--config", args.config] if args.config else []
    command += ["--resume", args.resume] if args.resume else []
    command += [flag for plugin in args.plugin for flag in ("--plugin", plugin)]
    return subprocess.call(command + overrides)
