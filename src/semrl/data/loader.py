"""Loading problems, with row-level errors: the shared jsonl schema (also parquet) read here, and
any other file, directory or hub id through the ``datasets`` library.

Schema (one object per row): ``problem`` (str), ``answer`` (str or number), optional ``id`` (str,
unique; a row without one is numbered ``row-N``, N its 1-based position among the file's rows, as
TRL and verl need no id), ``solution`` (str), ``level`` (int or null), ``subject`` (str); other
columns are kept (``Problem.extra``) for reward functions. ``Columns`` maps other column names onto
these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCHMARK_DIR = Path(__file__).parent / "benchmarks"
BENCHMARKS = sorted(p.stem for p in BENCHMARK_DIR.glob("*.jsonl"))


class DataError(ValueError):
    """A data problem that names the file and line and says how to fix it."""


@dataclass(frozen=True)
class Problem:
    """One problem: its id, text and gold answer, and what the dataset says of it (solution, level,
    subject, its other columns in ``extra``, handed to reward functions)."""

    id: str
    problem: str
    answer: str
    solution: str | None = None
    level: int | None = None
    subject: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # other dataset columns


def problem_columns(problem: Problem) -> dict[str, Any]:
    """The dataset columns of a problem as reward functions receive them (``answer``, ``id``, ...)."""
    return {
        **problem.extra,
        "id": problem.id,
        "answer": problem.answer,
        "solution": problem.solution,
        "level": problem.level,
        "subject": problem.subject,
    }


@dataclass(frozen=True)
class Columns:
    """The dataset's names of the ``problem``, ``answer`` and ``id`` columns (data.*_key)."""

    problem: str = "problem"
    answer: str = "answer"
    id: str = "id"

    def rename(self, row: dict[str, Any]) -> dict[str, Any]:
        out = dict(row)
        for canonical, key in (("problem", self.problem), ("answer", self.answer), ("id", self.id)):
            if key != canonical and key in out:
                out[canonical] = out.pop(key)
        return out


DEFAULT_COLUMNS = Columns()


def _row_to_problem(row: Any, where: str, columns: Columns = DEFAULT_COLUMNS) -> Problem:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    row = columns.rename(row)
    missing = [getattr(columns, k) for k in ("problem", "answer") if k not in row or row[k] is None]
    if missing:
        raise DataError(
            f"{where}: missing required field(s) {missing}; every row needs a problem and an answer "
            f"(columns '{columns.problem}', '{columns.answer}'; name yours with data.problem_key and "
            f"data.answer_key; found {sorted(row)})"
        )
    if row.get("id") is None:
        raise DataError(f"{where}: field '{columns.id}' is null; give the row an id or leave the column out")
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
    known = ("id", "problem", "answer", "solution", "level", "subject")
    return Problem(
        id=str(row["id"]),
        problem=problem,
        answer=answer,
        solution=row.get("solution"),
        level=level,
        subject=row.get("subject"),
        extra={k: v for k, v in row.items() if k not in known},
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


def _dataset_rows(name: str, split: str, columns: Columns) -> Any:
    """(where, row) of ``name``'s ``split`` through the ``datasets`` library: a parquet / json / csv /
    arrow file (one split), a directory (``save_to_disk`` output or a folder of data files) or a hub id."""
    path = Path(name).expanduser()
    if not path.exists() and (name.count("/") != 1 or name.startswith((".", "/", "~"))):
        raise DataError(  # before datasets loads (1.2 s)
            f"dataset '{name}' is neither a packaged benchmark "
            f"({', '.join(BENCHMARKS)}, 'arithmetic'), nor an "
            "existing file or directory, nor a hub id (owner/name)"
        )
    import datasets

    datasets.disable_progress_bars()
    if path.is_dir():
        saved = any((path / f).exists() for f in ("dataset_info.json", "dataset_dict.json", "state.json"))
        loaded = datasets.load_from_disk(str(path)) if saved else datasets.load_dataset(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise DataError(
                    f"dataset '{name}' has splits {sorted(loaded)}, not '{split}'; set data.train_split / "
                    "data.eval_split"
                )
            loaded = loaded[split]
    elif path.is_file():
        builders = {".json": "json", ".csv": "csv", ".arrow": "arrow", ".parquet": "parquet"}
        if path.suffix not in builders:
            raise DataError(
                f"data file '{path}': use a .jsonl, .json, .parquet, .csv or .arrow file, or a directory"
            )
        loaded = datasets.load_dataset(builders[path.suffix], data_files=str(path), split="train")
    else:
        try:
            loaded = datasets.load_dataset(name, split=split)
        except Exception as err:
            raise DataError(
                f"dataset '{name}' is not a packaged benchmark ({', '.join(BENCHMARKS)}, 'arithmetic'), an "
                "existing file or directory, and the Hugging Face hub could not give it "
                f"({type(err).__name__}: "
                f"{str(err)[:160]}). Offline: on a machine with network run "
                "datasets.load_dataset(NAME).save_to_disk(DIR), copy DIR here and give its path"
            ) from err
    for i, row in enumerate(loaded, start=1):
        yield f"{name} row {i}", {columns.id: f"row-{i}", **row}


def load_problems(
    path: str | Path, skip_bad_rows: bool = False, columns: Columns = DEFAULT_COLUMNS, split: str = "train"
) -> tuple[list[Problem], int]:
    """Read all problems of a .jsonl or .parquet file (shared schema), or of any file, directory or
    hub id the ``datasets`` library reads (``split`` of those with splits).

    Returns the problems and the number of skipped bad rows. With ``skip_bad_rows=False`` the
    first bad row raises ``DataError`` naming the file and line.
    """
    path = Path(path)
    if path.suffix in (".jsonl", ".parquet") and path.is_file():  # numbered like the datasets library's
        rows = (
            (where, {columns.id: f"row-{i}", **row} if isinstance(row, dict) else row)
            for i, (where, row) in enumerate(_iter_rows(path), start=1)
        )
    elif path.exists() or not str(path).endswith((".jsonl", ".parquet", ".json")):
        rows = _dataset_rows(str(path), split, columns)
    else:
        raise DataError(f"data file '{path}' does not exist")
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    skipped = 0
    for where, row in rows:
        try:
            if isinstance(row, DataError):
                raise row
            problem = _row_to_problem(row, where, columns)
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
    """A packaged benchmark name (e.g. 'math500'), a file or directory path, or a hub id (which
    ``load_problems`` reads through ``datasets``)."""
    if name in BENCHMARKS:
        return BENCHMARK_DIR / f"{name}.jsonl"
    path = Path(name).expanduser()
    if path.exists() or not name.endswith((".jsonl", ".parquet", ".json")):
        return path
    raise DataError(
        f"dataset '{name}' is neither a packaged benchmark ({', '.join(BENCHMARKS)}, "
        "'arithmetic') nor an existing file"
    )
