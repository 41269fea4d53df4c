"""Re-score the committed evaluation records of Study 2 and Study 3 under the numeral rule
(``reward.numeral_answers``, docs/rewards-and-data.md "An answer must be an answer").

The rule only takes credit away: a sample stays correct unless its gold is a plain number and its
extracted answer is not a numeral. So no verifier runs here. Each eval records file
(``eval/{split}-step-*.jsonl``) is re-summarised with ``semrl.evaluation.summarize_records``. The
script first checks that the original records give the logged metrics, then swaps in the
re-scored values and recomputes every rule's per-seed differences. Nothing is re-judged: the
output gives how many samples change and each rule's mean difference before and after.

    python scripts/rescore_studies.py            # prints a markdown report
    python scripts/rescore_studies.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from semrl.core.jsonl import COMPRESSED_SUFFIX, log_exists, read_jsonl
from semrl.evaluation import summarize_records
from semrl.reward.answer_form import fails_numeral_rule
from semrl.studies.comparison import rule_differences
from semrl.studies.discovery import Run, find_runs
from semrl.studies.rules_file import load_rules

ROOT = Path(__file__).resolve().parents[1]
STUDIES = {
    "Study 2": (ROOT / "results" / "study_sparse", ROOT / "src/semrl/configs/study/study_sparse_rules.yaml"),
    "Study 3": (ROOT / "results" / "study3", ROOT / "src/semrl/configs/study/study3_rules.yaml"),
}


def rescored(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The records with every credited sample that breaks the rule made wrong, and those samples."""
    changed: list[dict[str, Any]] = []
    out = []
    for record in records:
        samples = []
        for sample in record["samples"]:
            answer = sample["answer"]
            if sample["correct"] and answer is not None and fails_numeral_rule(record["gold"], answer):
                changed.append({"id": record["id"], "gold": record["gold"], "answer": sample["answer"]})
                sample = {**sample, "correct": False}
            samples.append(sample)
        out.append({**record, "samples": samples})
    return out, changed


def rescore_run(run: Run) -> tuple[Run, list[dict[str, Any]], int]:
    """The run with its evaluation metrics re-summarised, the samples that changed, and how many
    samples its records hold."""
    rows = [dict(r) for r in run.rows]
    by_step = {int(r["step"]): r for r in rows}
    changed: list[dict[str, Any]] = []
    total = 0
    for path in sorted((run.run_dir / "eval").glob("*-step-*.jsonl*")):  # plain or compressed
        name = path.name.removesuffix(COMPRESSED_SUFFIX).removesuffix(".jsonl")
        split, step = name.split("-step-")[0], int(name.split("-step-")[1])
        records = read_jsonl(path)
        total += sum(len(r["samples"]) for r in records)
        row = by_step.get(step)
        if row is None:
            continue
        for key, value in summarize_records(records).items():  # the records give the logged metrics
            logged = row.get(f"{split}/{key}")
            if logged is not None and not math.isclose(logged, value, rel_tol=1e-9, abs_tol=1e-12):
                raise SystemExit(f"{path}: {split}/{key} is {value} from the records, {logged} logged")
        new, gone = rescored(records)
        changed += [{**c, "file": str(path.relative_to(ROOT)).removesuffix(COMPRESSED_SUFFIX)} for c in gone]
        row.update({f"{split}/{k}": v for k, v in summarize_records(new).items()})
    return replace(run, rows=rows), changed, total


def training_samples_credited(run: Run) -> tuple[int, int]:
    """(logged training samples, those credited (a reward of 1) that break the rule)."""
    path = run.run_dir / "samples.jsonl"
    if not log_exists(path):
        return 0, 0
    rows = read_jsonl(path)
    bad = sum(
        r.get("reward", 0.0) >= 1.0
        and r.get("answer") is not None
        and fails_numeral_rule(str(r["gold"]), r["answer"])
        for r in rows
    )
    return len(rows), bad


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    lines: list[str] = []
    for study, (root, rules_path) in STUDIES.items():
        rules = load_rules(rules_path).rules
        groups = find_runs([root])
        new_groups: dict[str, list[Run]] = {}
        changed: list[dict[str, Any]] = []
        total = train_total = train_bad = 0
        for variant, runs in groups.items():
            for run in runs:
                new_run, gone, n = rescore_run(run)
                new_groups.setdefault(variant, []).append(new_run)
                changed += [{**c, "variant": variant, "seed": run.seed} for c in gone]
                total += n
                t, b = training_samples_credited(run)
                train_total, train_bad = train_total + t, train_bad + b
        before, after = rule_differences(groups, rules), rule_differences(new_groups, rules)
        estimates = {
            rule.id: {
                "metric": rule.metric,
                "pair": f"{rule.variant} - {rule.baseline}",
                "seeds": len(before[rule.id]),
                "before": mean(list(before[rule.id].values())),
                "after": mean(list(after[rule.id].values())),
                "seeds_changed": sum(before[rule.id][s] != after[rule.id].get(s) for s in before[rule.id]),
            }
            for rule in rules
        }
        report[study] = {
            "eval_samples": total,
            "eval_changed": len(changed),
            "changed": changed,
            "train_samples": train_total,
            "train_changed": train_bad,
            "rules": estimates,
        }
        lines += [
            f"### {study}",
            "",
            f"{len(changed)} of {total:,} evaluation samples lose their credit; "
            f"{train_bad} of {train_total:,} logged training samples would have.",
            "",
            "| rule | metric | pair | seeds | mean difference before | after | change | seeds changed |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for rule_id, e in estimates.items():
            lines.append(
                f"| {rule_id} | {e['metric']} | {e['pair']} | {e['seeds']} | {e['before']:+.4f} | "
                f"{e['after']:+.4f} | {e['after'] - e['before']:+.4f} | {e['seeds_changed']} |"
            )
        by_answer: dict[str, int] = {}
        for c in changed:
            key = f"`{c['answer']}` for {c['gold']}"
            by_answer[key] = by_answer.get(key, 0) + 1
        counted = sorted(by_answer.items(), key=lambda kv: -kv[1])
        listed = ", ".join(f"{k} ({v})" for k, v in counted) if counted else "none"
        lines += ["", f"Answers that lose credit (count): {listed}", ""]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
