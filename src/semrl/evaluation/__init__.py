"""Evaluation: unbiased pass@k (Chen et al. 2021), mean@k, maj@k, lengths, distinct answers.

A *problem record* (one JSON line of ``problems.jsonl``) holds a problem's n samples::

    {"id", "gold", "level", "subject",
     "samples": [{"response", "answer", "correct", "length", "truncated", "timed_out", "cluster"}]}

``cluster`` numbers the sample's answer-equivalence class within the problem (math-verify, as the
semantic entropy of ``semrl.methods.semantic_entropy``); a sample without an answer is its own class.
Metric definitions: docs/algorithms.md "Evaluation metrics".
"""

from __future__ import annotations

from semrl.evaluation.datasets import (
    PRESETS,
    EvalSettings,
    evaluate_dataset,
    evaluate_datasets,
    markdown_table,
)
from semrl.evaluation.held_out import (
    EVAL_SPLITS,
    evaluate_held_out,
    evaluate_splits,
    evaluation_key,
    records_path,
    weights_fingerprint,
)
from semrl.evaluation.metrics import maj_at_k, pass_at_k, report_ks, summarize_by, summarize_records
from semrl.evaluation.sampling import SampledProblem, judge_samples, sample_and_verify

__all__ = [
    "maj_at_k",
    "pass_at_k",
    "report_ks",
    "summarize_by",
    "summarize_records",
    "SampledProblem",
    "judge_samples",
    "sample_and_verify",
    "EvalSettings",
    "PRESETS",
    "evaluate_dataset",
    "evaluate_datasets",
    "markdown_table",
    "EVAL_SPLITS",
    "evaluate_held_out",
    "evaluate_splits",
    "evaluation_key",
    "records_path",
    "weights_fingerprint",
]
