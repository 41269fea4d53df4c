"""Command-line interface. Each command is a module of this package holding its parser and its
runner (``add_parser(sub)``, ``run(args)``); what a command does beyond reading its arguments and
printing lives in the library. Parsing imports no torch and no method: ``semrl --help`` and a config
error answer before anything heavy loads (``benchmarks/bench_startup.py``)."""

from __future__ import annotations

import argparse
import logging
import sys

from semrl.cli import checkpoint, compare, config, curriculum, evaluate, export, report, sweep, train
from semrl.errors import ConfigError, Preempted, TrainingError
from semrl.preemption import EXIT_PREEMPTED

COMMANDS = (train, evaluate, report, compare, sweep, config, checkpoint, export, curriculum)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("semrl")
    except PackageNotFoundError:  # run from a source tree that is not installed
        from semrl import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="semrl",
        description="RL with verifiable rewards for LLM reasoning: GRPO, Dr.GRPO and "
        "semantic-entropy-guided methods, from a laptop CPU to a GPU cluster.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("transformers", "httpx", "huggingface_hub", "vllm"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"semrl: error: {err}", file=sys.stderr)
        return 2
    except Preempted as err:
        print(f"semrl: preempted: {err}", file=sys.stderr)
        return EXIT_PREEMPTED
    except TrainingError as err:
        print(f"semrl: stopped: {err}", file=sys.stderr)
        return 3
    except BrokenPipeError:  # `semrl config | head`: the reader left; say nothing more
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141  # 128 + SIGPIPE, as a shell reports a command killed by it


if __name__ == "__main__":
    sys.exit(main())
