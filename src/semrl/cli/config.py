"""``semrl config``: the config reference, the methods, or a config file checked."""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import TYPE_CHECKING

from semrl.cli.common import SubParsers, add_plugin_arg, load_plugins_of

if TYPE_CHECKING:
    from semrl.config.sections import Config


def add_parser(sub: SubParsers) -> None:
    conf = sub.add_parser(
        "config",
        help="print the config reference or check a config file",
        description="Without arguments: every config key with type, default and meaning; with section "
        "names (semrl config rollout trainer): only those sections' keys. To a terminal the reference is "
        "wrapped to its width; piped, it is the Markdown of docs/config-reference.md.",
    )
    conf.add_argument(
        "--check",
        nargs="?",
        const="",
        metavar="YAML",
        help="validate a config file (a path, or a packaged config's name such as demo) with overrides, "
        "and read what training reads before a model: the problems of data.* and the reward functions",
    )
    conf.add_argument("--config", metavar="YAML", help="the config file to check (the same as --check YAML)")
    conf.add_argument("--methods", action="store_true", help="list the registered methods")
    add_plugin_arg(conf)
    conf.add_argument(
        "overrides",
        nargs="*",
        help="with --check: section.key=value overrides; without: the sections to list (e.g. rollout)",
    )
    conf.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    load_plugins_of(args)
    from semrl.config.load import config_reference, load_config, methods_table
    from semrl.errors import ConfigError

    target = args.check or args.config
    if args.methods:
        print(methods_table())
    elif args.check is not None or args.config:
        if not target:
            raise ConfigError("--check needs a config file: semrl config --check FILE [overrides]")
        if args.check and args.config:
            raise ConfigError(f"two config files, --check {args.check} and --config {args.config}: one")
        cfg = load_config(target, args.overrides)
        _check_inputs(cfg)
        print(f"{target}: OK (method {cfg.algorithm.method})")
    else:
        if overrides := [s for s in args.overrides if "=" in s]:
            raise ConfigError(
                f"overrides {overrides} need a config to apply to: "
                f"semrl config --check FILE {' '.join(overrides)}"
            )
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        print(config_reference(args.overrides, width=width and max(60, min(width, 100))))
    return 0


def _check_inputs(cfg: Config) -> None:
    """What ``semrl train`` reads before any model: the problems of data.* (files, columns, ids) and
    the reward functions (imported, signatures checked). Torch stays out: this takes seconds."""
    from semrl.data.problem_sets import run_problems
    from semrl.reward import reward_functions

    reward_functions(cfg.reward.functions, cfg.reward.weights, None, cfg.reward.correctness)
    run_problems(cfg)
