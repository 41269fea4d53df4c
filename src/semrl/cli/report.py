"""``semrl report``: a run's self-contained HTML report."""

from __future__ import annotations

import argparse

from semrl.cli.common import SubParsers


def add_parser(sub: SubParsers) -> None:
    rep = sub.add_parser(
        "report",
        help="write a run's HTML report",
        description="A self-contained HTML page (no server, no network) with training and evaluation "
        "curves, evaluation tables and the reasoning-tree viewer, plus PNG curves (with matplotlib).",
    )
    rep.add_argument("run_dir", help="run directory (logging.output_dir)")
    rep.add_argument("--output", help="directory for index.html and figures/ (default RUN_DIR/report)")
    rep.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from semrl.studies.runs import write_report

    index = write_report(args.run_dir, args.output)
    figures = index.parent / "figures"
    where = f"; figures in {figures}" if figures.is_dir() and any(figures.iterdir()) else ""
    print(f"report: {index}  (open it in a browser{where})")
    return 0
