"""``semrl config``: the config reference, the methods, or a config file checked."""

from __future__ import annotations

import argparse

from semrl.cli.common import SubParsers, add_plugin_arg, reading_config


def add_parser(sub: SubParsers) -> None:
    conf = sub.add_parser(
        "config", help="print the config reference or check a config file",
        description="Without arguments: every config key with type, default and meaning; with section "
        "names (semrl config rollout trainer): only those sections' keys.",
    )
    conf.add_argument("--check", metavar="YAML", help="validate a config file (with overrides)")
    conf.add_argument("--methods", action="store_true", help="list the registered methods")
    add_plugin_arg(conf)
    conf.add_argument(
        "overrides", nargs="*",
        help="with --check: section.key=value overrides; without: the sections to list (e.g. rollout)",
    )
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
            print(_sections_only(config_reference(), args.overrides))
    return 0


def _sections_only(reference: str, sections: list[str]) -> str:
    """The reference's rows of ``sections`` (all with none)."""
    import difflib

    from semrl.errors import ConfigError

    if not sections:
        return reference
    if overrides := [s for s in sections if "=" in s]:
        raise ConfigError(
            f"overrides {overrides} need a config to apply to: "
            f"semrl config --check FILE {' '.join(overrides)}"
        )
    rows = reference.split("\n\nMethods")[0].splitlines()
    known = sorted({row.split("`")[1].split(".")[0] for row in rows[2:]})
    for name in sections:
        if name not in known:
            hint = difflib.get_close_matches(name, known, n=1)
            extra = f" Did you mean '{hint[0]}'?" if hint else ""
            raise ConfigError(f"no config section '{name}'.{extra} The sections: {', '.join(known)}")
    return "\n".join([*rows[:2], *(r for r in rows[2:] if r.split("`")[1].split(".")[0] in sections)])
