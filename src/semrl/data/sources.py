"""The one way a dataset name becomes problems, for training, evaluation and curriculum scoring."""

from __future__ import annotations

import logging
from typing import Literal

from semrl.data.arithmetic import make_arithmetic_problems
from semrl.data.loader import DEFAULT_COLUMNS, Columns, Problem, load_problems, resolve_dataset

logger = logging.getLogger(__name__)

ARITHMETIC = "arithmetic"
# Held-out arithmetic problems are generated with seed + this offset (and exclude the training texts).
EVAL_SEED_OFFSET = 10_007


def load_dataset(
    name: str,
    *,
    split: Literal["train", "eval"],
    seed: int,
    arithmetic_size: int,
    levels: list[int],
    exclude: set[str] | None = None,
    skip_bad_rows: bool = False,
    columns: Columns = DEFAULT_COLUMNS,
    dataset_split: str = "train",
) -> list[Problem]:
    """Problems of ``name``: 'arithmetic' (``arithmetic_size`` problems of ``levels``, generated from
    ``seed``, or ``seed + EVAL_SEED_OFFSET`` for the eval split), a packaged benchmark or a file.
    ``exclude`` removes problems with these texts (the held-out ones from a training set);
    ``columns`` and ``dataset_split`` apply to files and datasets (``semrl.data.loader``)."""
    if name == ARITHMETIC:
        offset = EVAL_SEED_OFFSET if split == "eval" else 0
        return make_arithmetic_problems(arithmetic_size, levels, seed + offset, exclude)
    problems, skipped = load_problems(resolve_dataset(name), skip_bad_rows, columns, dataset_split)
    if skipped:
        logger.warning("%s: skipped %d bad rows (data.skip_bad_rows=true)", name, skipped)
    if exclude:
        problems = [p for p in problems if p.problem not in exclude]
    return problems
