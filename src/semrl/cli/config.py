"""``semrl config``: the config reference, the methods, or a config file checked."""

from __future__ import annotations

import argparse

from semrl.cli.common import SubParsers, add_plugin_arg, reading_config


def add_parser(sub: SubParsers) -> None:
    conf = sub.add_parser(
        "config", help="print the config reference or check a config file",
        description="Without arguments: every config key with type, default and meaning.",
    )
    conf.add_argument("--check", metavar="YAML", help="validate a config file (with overrides)")
    conf.add_argument("--methods", action="store_true", help="list the registered methods")
    add_plugin_arg(conf)
    conf.add_argument("overrides", nargs="*", help="section.key=value overrides")
    conf.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with reading_config(args):
        from semrl.configure import config_reference, load_config, methods_table

        if args.methods:
            print(methods_table())
        elif args.check:
            cfg = load_config(args.check, args.overrides)
            print(f"{args.check}: OK (method {cfg.algorithm.method})")
        else:
            print(config_reference())
    return 0
