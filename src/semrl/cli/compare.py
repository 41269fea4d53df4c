"""``semrl compare``: runs side by side, or a sweep's variants across seeds."""

from __future__ import annotations

import argparse
from pathlib import Path

from semrl.cli.common import SubParsers
from semrl.errors import ConfigError


def add_parser(sub: SubParsers) -> None:
    cmp = sub.add_parser(
        "compare",
        help="compare runs side by side, or variants across seeds",
        description="Run directories: final metrics side by side and per-step tables (Markdown), and with "
        "--output one PNG per metric with all runs overlaid. A sweep directory (OUT/VARIANT/seed-S) or "
        "--group-by KEY: each variant's seeds aggregated (mean +- s.e. per step and at the end, pass@k for "
        "k = 1..n beside the base model's; paired differences at the seed level against --baseline, or "
        "between every pair: a 95 percent t-interval over the per-seed differences, how many seeds agree, "
        "the smallest difference detectable at 80 percent power and the seeds the observed one would need; "
        "at equal steps and at equal sampled tokens); with --output also results.md, aggregate.json, PNG "
        "figures and index.html (docs/sweeps.md, docs/evaluation.md).",
    )
    cmp.add_argument("run_dirs", nargs="+", help="run directories, or one sweep directory")
    cmp.add_argument("--metric", nargs="+", help="metrics (default: reward, accuracy, entropy, ..., eval)")
    cmp.add_argument("--output", help="directory for the tables and PNG plots")
    cmp.add_argument(
        "--group-by",
        metavar="KEY",
        help="config key whose value names a run's variant, e.g. algorithm.method",
    )
    cmp.add_argument(
        "--baseline",
        metavar="VARIANT",
        help="variant the others are compared with, paired by seed (default: every pair)",
    )
    cmp.add_argument(
        "--x-axis",
        choices=["step", "tokens"],
        default="step",
        help="x axis of the per-step figures: training step, or cumulative sampled tokens (default step)",
    )
    cmp.add_argument(
        "--window",
        type=int,
        default=1,
        metavar="N",
        help="compare training metrics (entropy, accuracy, ...) as their mean over each run's last N steps "
        "(default 1: the last step)",
    )
    cmp.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        metavar="S",
        help="only these seeds, e.g. those whose runs have all finished while the sweep goes on "
        "(default: every seed with a finished run)",
    )
    cmp.add_argument(
        "--decide",
        metavar="RULES_YAML",
        help="decision rules fixed before the study (metric, pair, expected direction, margin), with the "
        "study's design (fixed or group-sequential looks, alpha, multiplicity families): each is judged "
        "decided, decided against, ruled out or undecided at the design's latest planned look, which is "
        "appended to SWEEP_DIR/looks.jsonl (docs/evaluation.md, 'Designs')",
    )
    cmp.add_argument(
        "--descriptive",
        action="store_true",
        help="with --decide and --seeds: report a seed count the design did not plan, intervals without "
        "outcomes",
    )
    cmp.add_argument(
        "--allow-different-evaluations",
        action="store_true",
        help="set runs side by side although their held-out problems, reward functions or evaluation "
        "settings differ (said above the table); without it such runs are refused",
    )
    cmp.add_argument(
        "--variance",
        action="store_true",
        help="for each compared pair, split the seed-to-seed variance of the final held-out differences "
        "into the evaluation's draw of problems and samples and training, from the runs' problem records "
        "(docs/results.md, 'Where the variance is')",
    )
    cmp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for given in args.run_dirs:  # before the statistics libraries load
        if not Path(given).exists():
            raise ConfigError(
                f"'{given}' does not exist: give run directories or a sweep directory (the "
                "output_dir of a sweep file)"
            )
    if args.decide and not Path(args.decide).is_file():
        raise ConfigError(f"decision rules file '{args.decide}' does not exist")
    from semrl.core.jsonl import log_exists
    from semrl.studies.rules_file import load_rules
    from semrl.studies.runs import compare_runs
    from semrl.studies.seeds import compare_seeds

    sweep_dir = len(args.run_dirs) == 1 and not log_exists(Path(args.run_dirs[0]) / "metrics.jsonl")
    from semrl.studies.discovery import run_directories
    from semrl.studies.evaluation_match import dtype_note

    grouped = bool(args.group_by or sweep_dir)
    runs = (
        run_directories(args.run_dirs, args.group_by)
        if grouped
        else {Path(d).name: Path(d) for d in args.run_dirs}
    )
    if (note := dtype_note(runs)) is not None:
        print(note + "\n")
    if grouped:
        rules = load_rules(args.decide) if args.decide else ()
        print(
            compare_seeds(
                args.run_dirs,
                args.output,
                args.group_by,
                args.baseline,
                args.metric,
                args.x_axis,
                args.window,
                rules,
                args.seeds,
                args.descriptive,
            )
        )
        if args.variance:
            from semrl.studies.comparison import comparison_pairs
            from semrl.studies.discovery import find_runs
            from semrl.studies.variance import variance_section

            groups = find_runs(args.run_dirs, args.group_by, args.seeds)
            print(variance_section(groups, comparison_pairs(groups, args.baseline)))
    elif args.baseline or args.decide or args.seeds or args.variance:
        flag = next(
            f
            for f, v in (
                ("--baseline", args.baseline),
                ("--decide", args.decide),
                ("--seeds", args.seeds),
                ("--variance", args.variance),
            )
            if v
        )
        raise ConfigError(f"{flag} compares variants across seeds: give a sweep directory or --group-by KEY")
    else:
        _check_evaluated_alike(args.run_dirs, args.allow_different_evaluations)
        print(compare_runs(args.run_dirs, args.metric, args.output))
    return 0


def _check_evaluated_alike(run_dirs: list[str], allowed: bool) -> None:
    """Refuse runs whose held-out numbers cannot be set side by side, or, ``allowed``, say how they
    differ above the table."""
    from semrl.studies.evaluation_match import evaluation_differences

    differ = evaluation_differences(run_dirs)
    if not differ:
        return
    listed = "; ".join(
        f"{key}: " + ", ".join(f"{Path(run).name} {v!r}" for run, v in values.items())
        for key, values in differ.items()
    )
    if not allowed:
        raise ConfigError(
            f"these runs were not evaluated alike, so their held-out numbers do not compare ({listed}). "
            "Compare runs of one evaluation, or pass --allow-different-evaluations to see them side by side"
        )
    print(f"**Not evaluated alike** (held-out numbers do not compare): {listed}\n")
