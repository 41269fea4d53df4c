"""A study's frozen code is its registration: compare the commits a study ran on with its registered
commit, through git, and refuse any difference that no recorded deviation lists.

    python scripts/check_study_code.py results/study4a/code.yaml

The record (``code.yaml`` beside the study's results) names the registered commit, the path of the
study's driver script, each deviation (its commit range ``from``..``to`` and every file it changes;
``driver_only``: it changes the driver script alone, which runs beside the frozen worktree), and each
part of the study with the ``code`` (worktree) and ``driver`` commits it ran on and the deviations
it ran under. It is refused when:

- a deviation's files are not exactly what git shows between its ``from`` and ``to`` (for a
  ``driver_only`` one: whether the driver changed);
- a part's code differs from the registered commit in a file none of its deviations lists;
- a part's driver differs from the registered driver and none of its deviations lists the driver.

Exit 0 with one line per part when the record holds, 2 with every refusal otherwise.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def _git(*args: str, repo: Path = REPO) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise LookupError(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def changed_files(old: str, new: str, path: str | None = None, repo: Path = REPO) -> set[str]:
    """The files that differ between commits ``old`` and ``new`` (a rename is its two paths), or
    within ``path`` only."""
    tail = ["--", path] if path else []
    return set(_git("diff", "--name-only", "--no-renames", old, new, *tail, repo=repo).split())


def check(record: dict[str, Any], repo: Path = REPO) -> list[str]:
    """Every refusal of ``record`` (a parsed ``code.yaml``); [] when it holds."""
    registered, driver_path = record["registered"], record["driver_path"]
    deviations = {d["number"]: d for d in record["deviations"]}
    refusals = []
    for number, deviation in deviations.items():
        path = driver_path if deviation.get("driver_only") else None
        actual = changed_files(deviation["from"], deviation["to"], path, repo)
        listed = set(deviation["files"])
        if actual != listed:
            refusals.append(
                f"deviation {number} ({deviation['from'][:7]}..{deviation['to'][:7]}) changes "
                f"{sorted(actual - listed)} that it does not list, and lists {sorted(listed - actual)} "
                "that it does not change"
            )
    for part in record["parts"]:
        under = [deviations[n] for n in part["deviations"]]
        code_listed = set().union(*(set(d["files"]) for d in under if not d.get("driver_only")))
        unlisted = changed_files(registered, part["code"], repo=repo) - code_listed
        if unlisted:
            refusals.append(
                f"{part['what']}: its code {part['code'][:7]} differs from the registered "
                f"{registered[:7]} in {sorted(unlisted)}, which no deviation of this part lists"
            )
        driver_changed = changed_files(registered, part["driver"], driver_path, repo)
        if driver_changed and not any(driver_path in d["files"] for d in under):
            refusals.append(
                f"{part['what']}: its driver {driver_path} at {part['driver'][:7]} differs from the "
                f"registered one, and no deviation of this part lists it"
            )
    return refusals


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(sys.argv[1])
    record = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        refusals = check(record)
    except LookupError as err:
        print(
            f"{path}: a commit it names is not in this clone ({err}); fetch the full history", file=sys.stderr
        )
        return 2
    for refusal in refusals:
        print(f"refused: {refusal}", file=sys.stderr)
    if refusals:
        return 2
    for part in record["parts"]:
        code, driver = part["code"][:7], part["driver"][:7]
        print(f"{code} (driver {driver}), deviations {part['deviations']}: {part['what']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
