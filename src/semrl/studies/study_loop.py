"""A sequential study run as a sweep (``semrl sweep --until-decided RULES``): seeds one after
another, each planned look judged as soon as its seeds are done, and the study stopped when every
primary rule is settled (docs/sweeps.md; the designs are ``semrl.studies.designs``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from semrl.studies.discovery import DONE_FILE
from semrl.studies.launch import run_with_header
from semrl.studies.sweep import Sweep, SweepError
from semrl.studies.sweep_runs import check_run_config, run_state

if TYPE_CHECKING:
    from semrl.studies.rules_file import Design, RulesFile


def _check_design(sweep: Sweep, rules: RulesFile) -> Design:
    """The rules' design, checked against the sweep: planned looks the sweep's seeds reach."""
    design = rules.design
    if design is None:
        raise SweepError(
            "--until-decided needs a rules file with a design (fixed or group_sequential looks, "
            "docs/evaluation.md 'Designs'); a plain list of rules plans no looks"
        )
    if design.looks[-1] > len(sweep.seeds):
        raise SweepError(
            f"the design's last look needs {design.looks[-1]} seeds; the sweep file lists "
            f"{len(sweep.seeds)} ({list(sweep.seeds)}): add seeds to 'seeds'"
        )
    named = {name for r in rules.rules for name in (r.variant, r.baseline)}
    if missing := sorted(named - set(sweep.variants)):
        raise SweepError(f"the rules compare variants the sweep does not run: {missing}")
    return design


def _spent_hours(sweep: Sweep) -> float:
    seconds = 0.0
    for run in sweep.runs:
        done = run.run_dir / DONE_FILE
        if done.exists():
            seconds += json.loads(done.read_text()).get("seconds", 0.0)
    return seconds / 3600


def _finished_seeds(sweep: Sweep) -> list[int]:
    """The seeds, in the sweep's order, whose every variant's run is done."""
    return [s for s in sweep.seeds if all(run_state(r) == "done" for r in sweep.runs if r.seed == s)]


def _take_looks(
    sweep: Sweep, rules: RulesFile, design: Design, echo: Callable[[str], Any]
) -> tuple[int, bool]:
    """Judge the looks the finished seeds reach (each appended to ``OUT/looks.jsonl`` once); returns
    (looks taken, whether every primary rule is settled or ruled out)."""
    from semrl.studies.comparison import rule_differences
    from semrl.studies.designs import (
        LOOKS_LOG,
        complete_seeds,
        judge_looks,
        judged_rows,
        log_looks,
        primary_done,
    )
    from semrl.studies.discovery import find_runs

    finished = _finished_seeds(sweep)
    if not finished:
        return 0, False
    diffs = rule_differences(find_runs([sweep.output_dir], seeds=finished), rules.rules)
    complete = complete_seeds(diffs)
    looks = judge_looks(diffs, rules, complete)
    for k in log_looks(sweep.output_dir / LOOKS_LOG, looks, design, complete):
        rows = "\n".join(f"  {row[0]}: {row[5]} {row[6]} -> {row[10]}" for row in judged_rows(looks[k - 1]))
        echo(f"look {k} at {design.looks[k - 1]} seeds:\n{rows}")
    return len(looks), bool(looks) and primary_done(looks[-1])


def study_status(sweep: Sweep, rules: RulesFile) -> str:
    """``semrl sweep --dry-run --until-decided RULES``: where a sequential study stands, read from
    its runs' ``sweep_done.json`` and its looks log alone. It judges nothing and reads no metric, so
    it can be run as often as wanted between looks without being one; the runs' list follows."""
    from semrl.studies.designs import LOOKS_LOG, primary_done, read_looks

    design = _check_design(sweep, rules)
    logged = read_looks(sweep.output_dir / LOOKS_LOG)
    seeds = list(sweep.seeds)[: design.looks[-1]]
    states = {run.name: run_state(run) for run in sweep.runs if run.seed in seeds}
    finished = [s for s in _finished_seeds(sweep) if s in seeds]
    hours = _spent_hours(sweep)
    budget = f" of max_hours {design.max_hours:g}" if design.max_hours is not None else ""
    lines = [
        f"sequential study: {design.type} design, looks at {', '.join(map(str, design.looks))} seeds; "
        f"{len(finished)} of {len(seeds)} seeds finished every variant "
        f"({sum(v == 'done' for v in states.values())} of {len(states)} runs); "
        f"runs' hours {hours:.1f}{budget}"
    ]
    for look in logged:
        outcomes = ", ".join(f"{r['id']} {r['outcome']}" for r in look["rules"])
        lines.append(f"look {look['look']} at {len(look['seeds'])} seeds ({look['time']}): {outcomes}")
    if logged and primary_done(logged[-1]["rules"]):
        lines.append(f"stopped at look {len(logged)}: every primary rule is settled")
    elif len(logged) == len(design.looks):
        lines.append(f"stopped: the design's last look ({len(logged)}) is taken")
    elif design.max_hours is not None and hours >= design.max_hours:
        lines.append(
            f"stopped: the runs' hours passed max_hours; the looks it reaches are taken by the next "
            f"`semrl sweep --until-decided`, which then runs nothing (looks taken: {len(logged)})"
        )
    else:
        following = design.looks[len(logged)]
        read = seeds[:following]
        needed = [run.name for run in sweep.runs if run.seed in read and states[run.name] != "done"]
        if not needed:
            needed_text = "every run it reads is finished: the next `semrl sweep --until-decided` takes it"
        else:
            started = [name for name in needed if states[name] != "new"]
            needed_text = f"{len(needed)} run(s) left"
            if started:
                needed_text += f"; started: {', '.join(started)}"
        lines.append(
            f"next: look {len(logged) + 1} at {following} seeds (seeds "
            f"{seeds[0]}-{seeds[following - 1]}): {needed_text}"
        )
    return "\n".join(lines)


def run_until_decided(sweep: Sweep, rules: RulesFile, echo: Callable[[str], Any] = print) -> int:
    """``semrl sweep --until-decided RULES``: seeds one at a time in seed order (every variant of a
    seed, then the next seed), the rules judged at each planned look of their design
    (``semrl.studies.designs``), stopping when every primary rule is decided, decided against or
    ruled out, at the design's last look, or when the runs' hours pass ``design.max_hours``. Runs
    again where it stopped, as ``run_local`` does. Returns 0 when the study stopped by its design."""
    from semrl.runtime.preemption import EXIT_PREEMPTED

    design = _check_design(sweep, rules)
    for run in sweep.runs:
        check_run_config(sweep, run)
    seeds = list(sweep.seeds)[: design.looks[-1]]
    for index, seed in enumerate(seeds):
        taken, settled = _take_looks(sweep, rules, design, echo)
        if settled or taken == len(design.looks):
            why = "every primary rule is settled" if settled else "the design's last look is taken"
            echo(
                f"study stopped at look {taken} of {len(design.looks)}: {why} "
                f"({sweep.output_dir / 'looks.jsonl'})"
            )
            return 0
        if design.max_hours is not None and (hours := _spent_hours(sweep)) >= design.max_hours:
            echo(
                f"study stopped: its runs took {hours:.1f} h, the design's budget is {design.max_hours:g} h "
                f"(max_hours); looks taken: {taken}"
            )
            return 0
        following = next((n for n in design.looks if n > index), None)
        echo(
            f"seed {seed} ({index + 1} of at most {len(seeds)}); looks taken {taken}, "
            f"next at {following} seeds"
        )
        for run in (r for r in sweep.runs if r.seed == seed):
            if run_state(run) == "done":
                continue
            code = run_with_header(run, sweep, echo)
            if code == EXIT_PREEMPTED or code < 0:
                echo(f"{run.name}: stopped (exit {code}); run the same command again to continue")
                return EXIT_PREEMPTED
            if code != 0:
                echo(
                    f"{run.name}: failed with exit code {code}; see {run.run_dir}. A sequential study "
                    "cannot skip a seed: fix the cause and run the same command again"
                )
                return 1
    taken, settled = _take_looks(sweep, rules, design, echo)
    echo(f"study stopped at look {taken} of {len(design.looks)} ({sweep.output_dir / 'looks.jsonl'})")
    return 0
