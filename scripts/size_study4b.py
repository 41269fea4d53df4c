"""Size Study 4b from its pilot (docs/results.md, "Study 4b: the pilot"; issue 62, item 5).

    python scripts/size_study4b.py results/study4b_pilot

For each rule of the pilot's rules file (ROSE - Dr.GRPO over the learning curve), the per-seed
differences' s.d. with its 95% interval, and the seeds a fixed-design study needs for power 0.8 at
the planned effect (two-sided paired t-test at 0.05) if sigma is that s.d. or either end of its
interval; then the hours those seeds take at the pilot's mean hours per run (sweep_done.json), or
at --hours-per-seed where the pilot's wall times are not timings (runs cut, shared or paused). Study
4b can decide when every rule needs at most --max-seeds seeds at the pilot's s.d. and those seeds
fit in --budget-hours. The pilot's means are printed as they are and read as nothing: the pilot is never
evidence for Study 4b.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))  # this checkout's code, also from a worktree

from semrl.studies.comparison import rule_differences  # noqa: E402
from semrl.studies.decide import load_hypotheses  # noqa: E402
from semrl.studies.discovery import find_runs  # noqa: E402
from semrl.studies.stats import size_from_pilot  # noqa: E402

# the planned effects (issue 62): Study 2's +0.044 on pass@16, Study 3's -0.056 on pass@1
PLANNED = {"C1": 0.044, "C2": -0.056}


def run_hours(pilot: Path) -> dict[str, float]:
    """variant -> mean hours per finished run (sweep_done.json's seconds)."""
    hours: dict[str, list[float]] = {}
    for done in sorted(pilot.glob("*/seed-*/sweep_done.json")):
        record = json.loads(done.read_text())
        hours.setdefault(record["variant"], []).append(record["seconds"] / 3600)
    return {variant: sum(h) / len(h) for variant, h in hours.items()}


def size(
    pilot: Path, rules_path: Path, max_seeds: int, budget_hours: float, hours_per_seed: float | None = None
) -> tuple[str, bool]:
    """(the Markdown report, whether Study 4b can decide); ``hours_per_seed`` (one run of every
    variant) replaces the pilot's mean wall times."""
    rules = load_hypotheses(rules_path)
    groups = find_runs([pilot])
    diffs = rule_differences(groups, rules)
    hours = run_hours(pilot)
    variants = {r.variant for r in rules} | {r.baseline for r in rules}
    measured = sum(hours.get(v, float("nan")) for v in variants)
    per_seed = measured if hours_per_seed is None else hours_per_seed
    source = (
        "the pilot's mean wall time per run"
        if hours_per_seed is None
        else f"as given (the pilot's mean wall times: {measured:.2f})"
    )
    lines = [
        f"Pilot {pilot}: {', '.join(f'{v} {len(runs)} runs' for v, runs in groups.items())}; "
        f"{per_seed:.2f} hours per seed of every variant, {source}. Fixed design, two-sided paired "
        "t-test at 0.05, power 0.8.\n",
        "| rule | metric | seeds | pilot mean (descriptive) | s.d. [95%] | planned effect | seeds needed "
        "[at the s.d.'s interval] | hours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    can = True
    for rule in rules:
        d = list(diffs[rule.id].values())
        effect = PLANNED[rule.id]
        s = size_from_pilot(d, effect, max_seeds)
        need = "over 100,000" if s.needed is None else str(s.needed)
        ends = ", ".join("over 100,000" if n is None else str(n) for n in (s.needed_low, s.needed_high))
        spent = "" if s.needed is None else f"{s.needed * per_seed:.1f}"
        mean = sum(d) / len(d) if d else float("nan")
        lines.append(
            f"| {rule.id} | {rule.metric} (curve) | {s.seeds} | {mean:+.4f} | {s.sd:.4f} "
            f"[{s.sd_low:.4f}, {s.sd_high:.4f}] | {effect:+.3f} | {need} [{ends}] | {spent} |"
        )
        can = can and s.within and s.needed is not None and s.needed * per_seed <= budget_hours
    limits = f"{max_seeds} seeds and {budget_hours:g} hours"
    verdict = (
        f"Study 4b can decide: every rule within {limits}."
        if can
        else f"Study 4b cannot decide within {limits} at the pilot's s.d."
    )
    return "\n".join(lines) + "\n\n" + verdict + "\n", can


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pilot", type=Path, help="the pilot's sweep directory")
    parser.add_argument("--rules", type=Path, default=REPO / "configs/study/study4b_pilot_rules.yaml")
    parser.add_argument("--max-seeds", type=int, default=16)
    parser.add_argument("--budget-hours", type=float, default=24.0)
    parser.add_argument(
        "--hours-per-seed",
        type=float,
        help="hours of one run of every variant, measured alone, in place of the pilot's wall times",
    )
    args = parser.parse_args()
    if args.hours_per_seed is not None and not args.hours_per_seed > 0:
        parser.error(f"--hours-per-seed must be above 0, got {args.hours_per_seed}")
    report, _ = size(args.pilot, args.rules, args.max_seeds, args.budget_hours, args.hours_per_seed)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
