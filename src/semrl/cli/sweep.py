"""``semrl sweep``: a grid of variants x seeds, run here or submitted to slurm."""

from __future__ import annotations

import argparse
from pathlib import Path

from semrl.cli.common import SubParsers


def add_parser(sub: SubParsers) -> None:
    sw = sub.add_parser(
        "sweep",
        help="run a grid of variants x seeds (a multi-seed study)",
        description="A base config, named variants (sets of overrides) and seeds from one YAML file "
        "(docs/sweeps.md); each run goes to OUTPUT_DIR/VARIANT/seed-S. Finished runs are skipped and "
        "interrupted ones resumed, so running the same command again continues a study. Compare the "
        "variants across seeds with 'semrl compare OUTPUT_DIR'.",
    )
    sw.add_argument("sweep_file", help="sweep YAML file")
    sw.add_argument(
        "--dry-run",
        action="store_true",
        help="list the runs, their state and commands; run nothing. With --until-decided, first where the "
        "study stands: looks taken, the next look and the runs it needs, the hours against max_hours "
        "(read from the looks log and the finished runs' records; nothing is judged)",
    )
    sw.add_argument(
        "--launcher",
        choices=["local", "slurm", "submitit-local"],
        default="local",
        help="local: one run after another here (default); slurm: one job per run through submitit "
        "(pip install 'semrl[slurm]'); submitit-local: submitit's local executor, to try the job path here",
    )
    sw.add_argument("--partition", help="slurm partition")
    sw.add_argument("--account", help="slurm account")
    sw.add_argument("--gpus-per-node", type=int, help="GPUs per job")
    sw.add_argument("--cpus-per-task", type=int, help="CPUs per job")
    sw.add_argument("--timeout-min", type=int, help="time limit per job in minutes (default 240)")
    sw.add_argument("--array-parallelism", type=int, help="jobs of the array running at once")
    sw.add_argument("--wait", action="store_true", help="slurm: wait for every job to end")
    sw.add_argument(
        "--until-decided",
        metavar="RULES_YAML",
        help="a sequential study: seeds one at a time in seed order, the rules file's design judged at "
        "each planned look (appended to OUTPUT_DIR/looks.jsonl); stops when every primary rule is "
        "decided, decided against or ruled out, at the last look, or at the design's max_hours "
        "(local launcher; docs/sweeps.md)",
    )
    sw.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from semrl.errors import ConfigError

    for what, given in (("sweep file", args.sweep_file), ("decision rules file", args.until_decided)):
        if given and not Path(given).is_file():  # before the sweep's imports load torch
            raise ConfigError(f"{what} '{given}' does not exist")
    from semrl.studies import launch, study_loop
    from semrl.studies.sweep import load_sweep

    sweep = load_sweep(args.sweep_file)
    if args.dry_run:
        if args.until_decided:
            from semrl.studies.rules_file import load_rules

            print(study_loop.study_status(sweep, load_rules(args.until_decided)) + "\n")
        print(launch.dry_run(sweep))
        return 0
    if args.until_decided:
        if args.launcher != "local":
            from semrl.errors import ConfigError

            raise ConfigError("--until-decided runs seeds one after another: use the local launcher")
        from semrl.studies.rules_file import load_rules

        return study_loop.run_until_decided(sweep, load_rules(args.until_decided))
    if args.launcher == "local":
        return launch.run_local(sweep)
    options = {
        "partition": args.partition,
        "gpus_per_node": args.gpus_per_node,
        "cpus_per_task": args.cpus_per_task,
        "timeout_min": args.timeout_min,
        "array_parallelism": args.array_parallelism,
        "account": args.account,
    }
    folder = sweep.output_dir / ".submitit"
    cluster = "slurm" if args.launcher == "slurm" else "local"
    executor = launch.slurm_executor(sweep, folder, options, cluster=cluster)
    jobs = launch.submit(sweep, executor, wait=args.wait or cluster == "local")
    print(
        f"{len(jobs)} job(s) submitted; logs in {folder}. Run the same command again to see what is done "
        "and submit what is left."
    )
    return 0
