"""The figures of ``semrl compare``: per-step curves with s.e. bands, against steps and against
sampled tokens, and the pass@k-vs-k curve of the base model and every variant."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from semrl.studies.comparison import mean_tokens_at_steps, per_step
from semrl.studies.discovery import SPLITS, Run
from semrl.studies.tables import pass_at_k_curves

logger = logging.getLogger(__name__)


def _band(ax: Any, points: list[tuple[float, float, float, int]], label: str) -> None:
    """One variant's mean line with a +- s.e. band, in the variant's colour."""
    from semrl.studies.runs import method_color

    x = np.array([p[0] for p in points], dtype=float)
    m = np.array([p[1] for p in points])
    se = np.array([p[2] for p in points])
    color = method_color(label)
    ax.plot(x, m, marker="o", markersize=2.5, label=label, color=color)
    ax.fill_between(x, m - se, m + se, color=color, alpha=0.2, linewidth=0)


def _figure(
    plt: Any,
    path: Path,
    lines: dict[str, list[Any]],
    xlabel: str,
    ylabel: str,
    size: tuple[float, float],
    log_x: bool = False,
) -> Path:
    """A figure of every variant's band, saved as ``path``."""
    fig, ax = plt.subplots(figsize=size)
    for variant, points in lines.items():
        if points:
            _band(ax, points, variant)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def draw_curves(
    groups: dict[str, list[Run]], out: Path, metrics: Sequence[str], x_axis: str = "step"
) -> list[Path]:
    from semrl.studies.runs import pyplot

    plt = pyplot()
    if plt is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for split in SPLITS:
        curves = pass_at_k_curves(groups, split)
        if curves:
            ylabel = f"{'held-out' if split == 'eval' else 'transfer'} pass@k"
            written.append(
                _figure(
                    plt,
                    out / f"pass_at_k_{split}.png",
                    curves,
                    "k (samples per problem)",
                    ylabel,
                    (5.5, 3.6),
                    log_x=True,
                )
            )
    tokens = {v: mean_tokens_at_steps(runs) for v, runs in groups.items()}
    xlabel = "step" if x_axis == "step" else "sampled tokens (cumulative, mean over seeds)"
    for metric in metrics:
        by_step = {v: [p for p in per_step(runs, metric) if p[0] > 0] for v, runs in groups.items()}
        lines: dict[str, list[Any]] = dict(by_step)  # (x, mean, s.e., n), x a step or tokens
        if x_axis == "tokens":  # x: the mean cumulative sampled tokens over seeds at that step
            lines = {
                v: [(tokens[v][p[0]], *p[1:]) for p in pts if p[0] in tokens[v]] for v, pts in by_step.items()
            }
        if any(lines.values()):
            path = out / (metric.replace("/", "_").replace("@", "_at_") + ".png")
            ylabel = f"{metric} (mean ± s.e. over seeds)"
            written.append(_figure(plt, path, lines, xlabel, ylabel, (5.5, 3.4)))
    return written
