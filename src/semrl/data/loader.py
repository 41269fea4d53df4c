"""Loading problem files in the shared jsonl schema (also parquet), with row-level errors.

Schema (one object per row): ``id`` (str, unique), ``problem`` (str), ``answer`` (str or number),
optional ``solution`` (str), ``level`` (int or null), ``subject`` (str).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCHMARK_DIR = Path(__file__).parent / "benchmarks"
BENCHMARKS = sorted(p.stem for p in BENCHMARK_DIR.glob("*.jsonl"))


class DataError(ValueError):
    """A data problem that names the file and line and says how to fix it."""


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str
    solution: str | None = None
    level: int | None = None
    subject: str | None = None


def problem_columns(problem: Problem) -> dict[str, Any]:
    """The dataset columns of a problem as reward functions receive them (``answer``, ``id``, ...)."""
    return {"id": problem.id, "answer": problem.answer, "solution": problem.solution, "level": problem.level,
            "subject": problem.subject}


def _row_to_problem(row: Any, where: str) -> Problem:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in ("id", "problem", "answer") if k not in row or row[k] is None]
    if missing:
        raise DataError(
            f"{where}: missing required field(s) {missing}; every row needs 'id', 'problem' "
            "and 'answer'"
        )
    problem, answer = row["problem"], row["answer"]
    if not isinstance(problem, str) or not problem.strip():
        raise DataError(f"{where}: field 'problem' must be a non-empty string")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise DataError(f"{where}: field 'answer' must be a string or a number, got {answer!r}")
    answer = str(answer).strip()
    if not answer:
        raise DataError(f"{where}: field 'answer' is empty")
    level = row.get("level")
    if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
        raise DataError(f"{where}: field 'level' must be an integer or null, got {level!r}")
    return Problem(
        id=str(row["id"]),
        problem=problem,
        answer=answer,
        solution=row.get("solution"),
        level=level,
        subject=row.get("subject"),
    )


def _iter_rows(path: Path) -> Any:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise DataError(
                f"{path}: reading parquet needs pyarrow; install it with pip install 'semrl[parquet]'"
            ) from err
        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield f"{path} row {i}", row
        return
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path} line {lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield where, DataError(f"{where}: not valid UTF-8 ({err.reason} at byte {err.start})")
                continue
            if not line.strip():
                continue
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as err:
                yield where, DataError(f"{where}: invalid JSON ({err.msg} at column {err.colno})")


def load_problems(path: str | Path, skip_bad_rows: bool = False) -> tuple[list[Problem], int]:
    """Read all problems of a .jsonl or .parquet file.

    Returns the problems and the number of skipped bad rows. With ``skip_bad_rows=False`` the
    first bad row raises :class:`DataError` naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file '{path}' does not exist")
    if path.suffix not in (".jsonl", ".parquet"):
        raise DataError(f"data file '{path}': use a .jsonl or .parquet file")
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    skipped = 0
    for where, row in _iter_rows(path):
        try:
            if isinstance(row, DataError):
                raise row
            problem = _row_to_problem(row, where)
            if problem.id in seen:
                raise DataError(
                    f"{where}: duplicate id '{problem.id}' (first seen at {seen[problem.id]}); ids "
                    "must be unique within a file"
                )
        except DataError:
            if not skip_bad_rows:
                raise
            skipped += 1
            continue
        seen[problem.id] = where
        problems.append(problem)
    if not problems:
        raise DataError(f"data file '{path}' holds no valid problems")
    return problems, skipped


def resolve_dataset(name: str) -> Path:
    """A packaged benchmark name (e.g. 'math500') or a file path."""
    if name in BENCHMARKS:
        return BENCHMARK_DIR / f"{name}.jsonl"
    path = Path(name).expanduser()
    if path.exists():
        return path
    raise DataError(
        f"dataset '{name}' is neither a packaged benchmark ({', '.join(BENCHMARKS)}, "
        "'arithmetic') nor an existing file"
    )
