"""Problems, datasets and prompts."""

from semrl.data.arithmetic import make_arithmetic_problems
from semrl.data.loader import (
    BENCHMARKS,
    Columns,
    DataError,
    Problem,
    load_problems,
    problem_columns,
    resolve_dataset,
)
from semrl.data.prompts import PromptFormat, build_prompt_ids
from semrl.data.sampler import EpochSampler
from semrl.data.sources import ARITHMETIC, EVAL_SEED_OFFSET, load_dataset

__all__ = [
    "ARITHMETIC",
    "EVAL_SEED_OFFSET",
    "load_dataset",
    "BENCHMARKS",
    "Columns",
    "DataError",
    "EpochSampler",
    "Problem",
    "PromptFormat",
    "build_prompt_ids",
    "load_problems",
    "problem_columns",
    "make_arithmetic_problems",
    "resolve_dataset",
]
