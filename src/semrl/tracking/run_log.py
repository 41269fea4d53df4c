"""What a run writes as it goes: ``metrics.jsonl``, ``samples.jsonl``, ``trees.jsonl``, and the
same metrics and samples to the trackers of ``logging.report_to`` (``semrl.tracking.trackers``).

Only the main process writes. On resume the lines of steps after the checkpoint are dropped,
since those steps run again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from semrl.core.jsonl import read_jsonl
from semrl.reward import Scores
from semrl.rollout.batch import RolloutBatch
from semrl.tracking.trackers import Tracker
from semrl.tracking.tree_log import tree_records

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

LOG_FILES = ("metrics.jsonl", "samples.jsonl", "trees.jsonl")


def _stored_through(tracker: Tracker) -> int:
    try:
        return tracker.stored_through()
    except Exception as err:  # a store that cannot be read: send every step again rather than lose any
        logger.warning(
            "could not read which steps %s already stores (%r); sending them again",
            type(tracker).__name__,
            err,
        )
        return -1


class RunLog:
    """A run's files (``metrics.jsonl``, ``samples.jsonl``, ``trees.jsonl``) and trackers, written by the
    main process; on resume, the lines of steps that run again are dropped first."""

    def __init__(self, run_dir: Path, is_main: bool, trackers: Callable[[], list[Tracker]] = list) -> None:
        """``trackers``: opens the trackers (called on the main process only)."""
        self.run_dir, self.is_main = run_dir, is_main
        self.trackers = trackers() if is_main else []
        # On resume, per tracker: the last step it already stores. Steps after the checkpoint run
        # again (identically: resume is exact); trackers that keep every point (MLflow, Trackio) would
        # hold them twice, so those they have are not sent again.
        self.stored_through = [-1] * len(self.trackers)

    def truncate_after(self, step: int) -> None:
        """Drop the lines of steps after ``step`` (they belong to steps that will be re-run)."""
        self.stored_through = [_stored_through(tracker) for tracker in self.trackers]
        for name in LOG_FILES if self.is_main else ():
            log = self.run_dir / name
            if log.exists():
                kept = [row for row in read_jsonl(log) if row.get("step", 0) <= step]
                log.write_text("".join(json.dumps(row) + "\n" for row in kept), encoding="utf-8")

    def metrics(self, row: dict[str, float]) -> None:
        if not self.is_main:
            return
        with (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        for tracker, stored in zip(self.trackers, self.stored_through, strict=True):
            if row["step"] <= stored:
                continue
            tracker.log_metrics({k: v for k, v in row.items() if k != "step"}, int(row["step"]))

    def samples(
        self,
        batch: RolloutBatch,
        scores: Scores,
        advantages: torch.Tensor,
        step: int,
        tokenizer: PreTrainedTokenizerBase,
        num_samples: int,
        num_trees: int,
    ) -> None:
        """The first ``num_samples`` completions and ``num_trees`` rollout trees of this process's
        share of the batch; ``advantages`` is (N, T)."""
        if not self.is_main:
            return
        trees = tree_records(batch, scores, advantages, tokenizer, step, num_trees)
        if trees:
            with (self.run_dir / "trees.jsonl").open("a", encoding="utf-8") as fh:
                fh.write("".join(json.dumps(t) + "\n" for t in trees))
        rows = [
            {
                "step": step,
                "problem_id": batch.problems[i].id,
                "problem": batch.problems[i].problem,
                "gold": batch.problems[i].answer,
                "response": batch.texts[i],
                "tokens": len(batch.generations[i].token_ids),
                "answer": scores.results[i].answer,
                "reward": scores.rewards[i].item(),
            }
            for i in range(min(num_samples, len(batch.texts)))
        ]
        with (self.run_dir / "samples.jsonl").open("a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(row) + "\n" for row in rows))
        for tracker, stored in zip(self.trackers, self.stored_through, strict=True):
            if not rows or step <= stored:
                continue
            tracker.log_samples(rows, step)

    def close(self) -> None:
        """Close the trackers; the run's files take later rows still."""
        for tracker in self.trackers:
            tracker.close()
        self.trackers, self.stored_through = [], []
