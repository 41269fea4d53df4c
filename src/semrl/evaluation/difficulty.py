"""How hard each problem is for a model, by semantic entropy: SENT's curriculum scores
(docs/algorithms.md "SENT: curriculum"; read back by ``semrl.data.curriculum``).

``score_problems`` samples M answers per problem from a model, clusters them by answer equivalence
(math-verify through the verifier pool; an answer that cannot be extracted is its own cluster) and
writes one jsonl row per problem with its semantic entropy. The file is resumable: a re-run skips
the ids already in it, and rows are appended and flushed one problem at a time, so an interrupted
run loses at most the problems in flight.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from semrl.data import DataError, Problem
from semrl.data.curriculum import SCORE_FIELD
from semrl.data.prompts import PromptFormat
from semrl.evaluation import sample_and_verify
from semrl.methods.semantic_entropy import Estimator, cluster_entropy
from semrl.reward import Judge
from semrl.rollout.engines import Engine, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _done_ids(path: Path) -> set[str]:
    if not path.exists():
        return set()
    ids = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            ids.add(json.loads(line)["id"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise DataError(
                f"{path}:{number}: not a curriculum row; delete the "
                "line (it is re-scored) or pick another --output"
            ) from None
    return ids


def score_problems(
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase,
    judge: Judge,
    problems: list[Problem],
    output: Path,
    params: SamplingParams,
    num_samples: int = 8,
    prompt: PromptFormat | None = None,
    estimator: Estimator = "length_normalized",
    generator: torch.Generator | None = None,
    progress: Callable[[int], Any] | None = None,
) -> int:
    """Append a semantic-entropy row for every problem not yet in ``output``; returns rows written.
    Prompts are built as in training (``prompt``: ``data.system_prompt``, or ``data.prompt_template``;
    None: the chat template without a system prompt); ``judge`` decides which answers are correct."""
    prompt = prompt or PromptFormat()
    done = _done_ids(output)
    todo = [p for p in problems if p.id not in done]
    if progress is not None and len(problems) > len(todo):
        progress(len(problems) - len(todo))
    per_batch = max(1, engine.batch_size // num_samples)
    written = 0
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("a", encoding="utf-8") as fh:
        for start in range(0, len(todo), per_batch):
            chunk = todo[start : start + per_batch]
            sampled = sample_and_verify(
                engine, tokenizer, chunk, params, num_samples, prompt, judge, generator
            )
            for s in sampled:
                problem = s.problem
                mean_logp = torch.stack([g.logprobs.mean() for g in s.generations])
                row = {
                    "id": problem.id,
                    "problem": problem.problem,
                    "answer": problem.answer,
                    "level": problem.level,
                    SCORE_FIELD: cluster_entropy(s.clusters, mean_logp, estimator),
                    "num_clusters": len(set(s.clusters)),
                    "accuracy": float(np.mean([r.correct for r in s.rewards])),
                    "num_samples": num_samples,
                    "estimator": estimator,
                }
                fh.write(json.dumps(row) + "\n")
                fh.flush()
                written += 1
            if progress is not None:
                progress(len(chunk))
    return written
