"""Command-line interface. Each command is a module of this package holding its parser and its
runner (``add_parser(sub)``, ``run(args)``); what a command does beyond reading its arguments and
printing lives in the library. Parsing imports no torch and no method: ``semrl --help`` and a config
error answer before anything heavy loads (``benchmarks/bench_startup.py``)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import cast

from semrl.cli import checkpoint, compare, config, curriculum, evaluate, explore, export, report, sweep, train
from semrl.errors import ConfigError, Interrupted, Preempted, TrainingError, closest
from semrl.runtime.preemption import EXIT_PREEMPTED, unblock_stop_signals

COMMANDS = (train, evaluate, explore, report, compare, sweep, config, checkpoint, export, curriculum)


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
        description="RL with verifiable rewards for LLM reasoning: ROSE, SENT and their baselines on one "
        "trainer, run and compared over seeds. Run on CPUs (hf and vLLM engines, 1-2 processes) and on one "
        "GPU (an H200, hf engine: every method, with a 2-layer test model); multi-GPU training and vLLM "
        "on a GPU have not run yet (README, 'What has run where').",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _refuse_unknown(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> None:
    """Exit 2 naming the arguments ``command`` does not take, with the option each typo meant
    (``--confg`` -> ``--config``)."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    used = commands[command]
    options = [o for action in used._actions for o in action.option_strings if o.startswith("--")]
    hints = []
    for word in unknown:
        if word.startswith("-"):
            match = closest(word.split("=")[0], options)
            hints += [(word, match)] if match is not None else []
    if len(hints) == 1:
        extra = f". Did you mean '{hints[0][1]}'?"
    elif hints:
        extra = ". Did you mean " + ", ".join(f"'{meant}' for '{typo}'" for typo, meant in hints) + "?"
    else:
        extra = f"; see 'semrl {command} --help'"
    used.error(f"unrecognized arguments: {' '.join(unknown)}{extra}")


def main(argv: list[str] | None = None) -> int:
    unblock_stop_signals()  # before any thread starts: threads inherit the mask
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _refuse_unknown(parser, args.command, unknown)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("transformers", "httpx", "huggingface_hub", "vllm"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # torch's INFO lines (its FakeTensor cache statistics at exit, after a Ctrl-C in the first seconds)
    logging.getLogger("torch").setLevel(logging.WARNING)
    try:
        return cast("int", args.func(args))
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"semrl: error: {err}", file=sys.stderr)
        return 2
    except Preempted as err:
        print(f"semrl: preempted: {err}", file=sys.stderr)
        return EXIT_PREEMPTED
    except TrainingError as err:
        print(f"semrl: stopped: {err}", file=sys.stderr)
        return 3
    except Interrupted as err:
        print(f"semrl: {err}", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
    except KeyboardInterrupt:
        print(f"semrl: interrupted: 'semrl {args.command}' stopped (Ctrl-C)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `semrl config | head`: the reader left; say nothing more
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141  # 128 + SIGPIPE, as a shell reports a command killed by it


if __name__ == "__main__":
    sys.exit(main())
