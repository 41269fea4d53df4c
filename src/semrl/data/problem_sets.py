"""The problems of a run: held-out, training stages (one, or SENT's curriculum) and transfer, as
``data.*`` names them. Torch-free, so that ``semrl config --check`` and ``semrl train`` load them
before anything heavy does: a missing file or column fails in seconds, with no run directory."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Literal

from semrl.data.loader import Columns, DataError, Problem
from semrl.data.sources import ARITHMETIC, load_dataset

if TYPE_CHECKING:
    from semrl.config.sections import Config

HELD_OUT_OF_TRAIN = "auto"  # data.eval: problems held out of data.train (procedural ones for arithmetic)
HELD_OUT_SHARE = 5  # data.eval=auto holds out at most 1/HELD_OUT_SHARE of data.train's problems
HELD_OUT_SEED = 0  # one slice for every trainer.seed: seeds are compared on the same problems


def eval_source(data: dict[str, Any]) -> str:
    """Where ``data.eval`` (a config's ``data`` mapping) takes the held-out problems from, in words:
    the end-of-run table names it."""
    name = eval_problems_named(data)
    return f"{data['train']}, not trained on" if name == HELD_OUT_OF_TRAIN else str(name)


def eval_problems_named(data: dict[str, Any]) -> str | None:
    """``data.eval`` of a config's ``data`` mapping with 'auto' for arithmetic training written as
    'arithmetic', the same problems: configs written before 'auto' existed compare equal."""
    if data.get("eval") == HELD_OUT_OF_TRAIN and data.get("train") == ARITHMETIC:
        return ARITHMETIC
    return data.get("eval")


def held_out_of(problems: list[Problem], size: int, name: str) -> list[Problem]:
    """``data.eval=auto`` for a file or benchmark: ``min(size, len(problems) // HELD_OUT_SHARE)``
    problems of ``name`` drawn with ``HELD_OUT_SEED`` (the same for every run of the file)."""
    count = min(size, len(problems) // HELD_OUT_SHARE)
    if count == 0:
        raise DataError(
            f"data.train '{name}' has {len(problems)} problems, too few to hold out any for evaluation "
            f"(data.eval=auto holds out up to 1/{HELD_OUT_SHARE} of them); give data.eval a file or "
            "benchmark to evaluate on, or data.eval=null for no evaluation"
        )
    return random.Random(HELD_OUT_SEED).sample(problems, count)


def load_problem_sets(cfg: Config) -> tuple[list[Problem], list[list[Problem]]]:
    """(held-out problems, training stages): one stage, or the curriculum's stages of increasing
    semantic entropy (SENT). Held-out problems are drawn first so that training can exclude them
    (1-digit sums have only 100 problems)."""
    data = cfg.data

    def load(name: str, split: Literal["train", "eval"], exclude: set[str] | None = None) -> list[Problem]:
        size = data.arithmetic_size if split == "train" else data.eval_size
        return load_dataset(
            name,
            split=split,
            seed=cfg.trainer.seed,
            arithmetic_size=size,
            levels=data.arithmetic_levels,
            exclude=exclude,
            skip_bad_rows=data.skip_bad_rows,
            columns=Columns(data.problem_key, data.answer_key, data.id_key),
            dataset_split=data.train_split if split == "train" else data.eval_split,
        )

    named = eval_problems_named({"eval": data.eval, "train": data.train})
    if named == HELD_OUT_OF_TRAIN:
        held_out_problems = held_out_of(load(data.train, "train"), data.eval_size, data.train)
    else:
        held_out_problems = load(named, "eval")[: data.eval_size] if named else []
    if data.eval and not held_out_problems:
        raise DataError(f"data.eval '{data.eval}' gave no problems; raise data.eval_size")
    held_out = {p.problem for p in held_out_problems}
    if data.curriculum:
        from semrl.data.curriculum import curriculum_stages, load_curriculum

        scored = [(p, h) for p, h in load_curriculum(data.curriculum) if p.problem not in held_out]
        stages = curriculum_stages(scored, data.curriculum_stages)
    else:
        stages = [load(data.train, "train", held_out)]
    if not all(stages):
        raise DataError(
            f"data.train '{data.train}' has no problems left after removing the held-out ones; "
            "add arithmetic levels or lower data.eval_size"
        )
    return held_out_problems, stages


def load_transfer_problems(cfg: Config, exclude: list[list[Problem]]) -> list[Problem]:
    """The transfer split (``data.transfer``, ``data.eval_size`` problems) without any problem text of
    ``exclude`` (the training stages and held-out problems); [] when there is none."""
    data = cfg.data
    if not data.transfer:
        return []
    seen = {p.problem for problems in exclude for p in problems}
    problems = load_dataset(
        data.transfer,
        split="eval",
        seed=cfg.trainer.seed,
        arithmetic_size=data.eval_size,
        levels=data.transfer_levels,
        exclude=seen,
        skip_bad_rows=data.skip_bad_rows,
        columns=Columns(data.problem_key, data.answer_key, data.id_key),
        dataset_split=data.eval_split,
    )[: data.eval_size]
    if not problems:
        raise DataError(
            f"data.transfer '{data.transfer}' gave no problems outside the training and held-out ones"
        )
    return problems


def run_problems(cfg: Config) -> tuple[list[Problem], list[list[Problem]], list[Problem]]:
    """(held-out, training stages, transfer) of a run: the transfer split excludes the others."""
    held_out, stages = load_problem_sets(cfg)
    return held_out, stages, load_transfer_problems(cfg, [held_out, *stages])
