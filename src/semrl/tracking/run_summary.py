"""The table ``semrl train`` prints at the end of a run, from the run's ``metrics.jsonl`` rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from semrl.core.jsonl import read_jsonl
from semrl.tracking import metric_names as names

MAX_STEP_ROWS = 20
COST_COLUMNS = (names.SAMPLED_TOKENS, names.PREFILL_TOKENS, names.RUNNING_BATCH)


def _held_out_rows(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    k = next((key.split("@")[1] for key in after if key.startswith("eval/mean@")), None)
    rows = []
    names = [
        (f"eval/mean@{k}", f"mean@{k}", "{:.3f}"),
        (f"eval/pass@{k}", f"pass@{k}", "{:.3f}"),
        (f"eval/maj@{k}", f"maj@{k}", "{:.3f}"),
        ("eval/response_length", "response length", "{:.1f}"),
        ("eval/truncated_frac", "truncated", "{:.0%}"),
    ]
    for key, label, fmt in names:
        if key in after:
            old = fmt.format(before[key]) if key in before else "-"
            rows.append(f"  {label:<18}{old:>9}{fmt.format(after[key]):>9}")
    return rows


def _cost_columns(row: dict[str, Any]) -> str:
    sampled, prefill, batch = (row[k] for k in COST_COLUMNS)
    return f"  {sampled:>7.0f}  {prefill:>7.0f}  {batch:>6.1f}"


def _reward_error_rows(steps: list[dict[str, Any]]) -> list[str]:
    """Each reward function's errors and time-outs over the run (scored 0), when any had one."""
    functions = sorted(
        {k.split("/")[1] for r in steps for k in r if k.startswith("rewards/") and k.count("/") == 2}
    )
    totals = {
        f: tuple(sum(r.get(f"rewards/{f}/{kind}", 0.0) for r in steps) for kind in ("errors", "timeouts"))
        for f in functions
    }
    if not any(e or t for e, t in totals.values()):
        return []
    rows = [
        "",
        "reward function         errors  time-outs   (each scored 0; rewards/<function>/ in the metrics)",
    ]
    return rows + [f"  {f:<20}{e:>9.0f}{t:>11.0f}" for f, (e, t) in totals.items()]


def _time_rows(steps: list[dict[str, Any]]) -> list[str]:
    """Where a step's time went: the mean seconds of the rollout (its sampling), the reward and the
    update's phases over the steps that logged them, and each stage's share of the step."""
    timed = [r for r in steps if names.UPDATE_S in r and names.STEP_S in r]
    if not timed:
        return []

    def mean(key: str) -> float:
        return float(sum(r.get(key, 0.0) for r in timed)) / len(timed)

    step = mean(names.STEP_S)

    def share(seconds: float) -> str:
        return f"{seconds / step:>6.0%}" if step > 0 else ""

    plural = "s" * (len(timed) != 1)
    rows = ["", f"time per step (mean of {len(timed)} step{plural}, s)   share   (time/ in the metrics)"]
    rollout, sampling = mean(names.ROLLOUT_S), mean(names.SAMPLING_S)
    rows.append(f"  {'rollout':<28}{rollout:>7.2f}{share(rollout)}")
    if any(names.SAMPLING_S in r for r in timed):
        rows.append(f"    {'sampling (engine)':<26}{sampling:>7.2f}")
        rows.append(f"    {'around it (method)':<26}{mean(names.AROUND_SAMPLING_S):>7.2f}")
    reward, update = mean(names.REWARD_S), mean(names.UPDATE_S)
    rows.append(f"  {'reward':<28}{reward:>7.2f}{share(reward)}")
    rows.append(f"  {'update':<28}{update:>7.2f}{share(update)}")
    phased = 0.0
    for phase, label in names.UPDATE_PHASES:
        key = f"time/update/{phase}_s"
        if any(key in r for r in timed):
            seconds = mean(key)
            phased += seconds
            rows.append(f"    {label:<26}{seconds:>7.2f}")
    if phased:
        rows.append(f"    {'outside the phases':<26}{update - phased:>7.2f}")
    return rows


def run_summary(rows: list[dict[str, Any]], run_dir: str | Path, eval_source: str | None = None) -> str:
    """Held-out metrics before and after (on the problems of ``eval_source``, in words), reward,
    accuracy, length and time of every step, and where the run's files are."""
    steps = [r for r in rows if names.REWARD in r]
    evals = [r for r in rows if any(k.startswith("eval/mean@") for k in r)]
    minutes = sum(r.get(names.STEP_S, 0.0) for r in steps) / 60
    eval_minutes = sum(r.get(names.EVAL_S, 0.0) for r in rows) / 60
    plural = "s" * (len(steps) != 1)
    timing = f"{minutes:.1f} min training"
    if any(names.EVAL_S in r for r in rows):
        timing += f", {eval_minutes:.1f} min evaluation"
    lines = [f"run finished: {run_dir}  ({len(steps)} step{plural}, {timing})"]
    if evals:
        first, last = evals[0], evals[-1]
        problems = int(last.get(names.EVAL_PROBLEMS, 0))
        before = f"step {first.get('step', 0):>3}" if first is not last else " " * 8
        steps_row = f"{before}  step {last.get('step', 0):>3}"
        source = f" of {eval_source}" if eval_source else ""
        lines += ["", f"held-out ({problems} problems{source})   {steps_row}"]
        lines += _held_out_rows(first if first is not last else {}, last)
    if steps:
        every = -(-len(steps) // MAX_STEP_ROWS)  # long runs: every n-th step, and the last
        shown = [r for i, r in enumerate(steps) if i % every == every - 1 or i == len(steps) - 1]
        thinned = f"   (one step in {every})" if every > 1 else ""
        # the rollout's cost (docs/engines.md), in runs that logged it
        cost = all(k in r for r in shown for k in COST_COLUMNS)
        header = "  step   reward  accuracy  length   s/step" + ("  sampled  prefill   batch" if cost else "")
        lines += ["", header + thinned]
        lines += [
            f"  {r.get('step', 0):>4}  {r['reward']:>7.3f}  {r.get('accuracy', 0.0):>8.3f}  "
            f"{r.get('response_length', 0.0):>6.1f}  {r.get('time/step_s', 0.0):>7.1f}"
            + (_cost_columns(r) if cost else "")
            for r in shown
        ]
    lines += _time_rows(steps)
    lines += _reward_error_rows(steps)
    run = Path(run_dir)
    lines += [
        "",
        f"metrics: {run / 'metrics.jsonl'}   checkpoints: {run / 'checkpoints'}",
        f"report:  semrl report {run}   (HTML with the figures, in {run / 'report'})",
    ]
    return "\n".join(lines)


def summary_of_run(run_dir: str | Path) -> str:
    """``run_summary`` of a run directory's metrics."""
    import yaml

    from semrl.data.problem_sets import eval_source

    config = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    path = Path(run_dir) / "metrics.jsonl"
    return run_summary(read_jsonl(path), run_dir, eval_source(config["data"]))
