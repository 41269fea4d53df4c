"""A study's decisions as one figure (a forest plot): per rule, every seed's difference, the
descriptive 95% interval, the design's interval, the estimate, and the margin the rule reads them
against. What a reader of the decision table would otherwise assemble from eight rows of numbers."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semrl.studies.decide import metric_label


@dataclass(frozen=True)
class ForestRow:
    """One rule at one look.

    Attributes:
        label: the rule as the table names it (id, pair, metric).
        variant: the rule's variant, whose colour its marks take.
        estimate: mean of the per-seed differences.
        design: the design's interval at ``level``; None where the look is descriptive only.
        level: the design interval's nominal two-sided coverage (e.g. 0.994).
        descriptive: the 95% paired t-interval of the same differences.
        margin: the rule's margin delta; the band [-delta, +delta] is drawn, and rows whose margins
            differ are drawn in units of their own delta.
        outcome: the rule's outcome at this look.
        differences: every seed's difference (variant minus baseline).
    """

    label: str
    variant: str
    estimate: float
    design: tuple[float, float] | None
    level: float | None
    descriptive: tuple[float, float]
    margin: float
    outcome: str
    differences: Sequence[float]


def draw_forest(rows: Sequence[ForestRow], path: Path, title: str) -> Path | None:
    """The forest plot of ``rows`` (top to bottom in their order) as a PNG at ``path``; None when
    matplotlib is missing."""
    from semrl.studies.runs import method_color, pyplot

    plt = pyplot()
    if plt is None or not rows:
        return None
    fig, ax = plt.subplots(figsize=(8.5, 0.62 * len(rows) + 1.5))
    # rules on different scales (pass@k, lengths, tokens) share one axis in units of their margin
    scaled = len({r.margin for r in rows}) > 1 and all(r.margin > 0 for r in rows)
    band = 1.0 if scaled else rows[0].margin
    if band > 0:
        ax.axvspan(-band, band, color="#d9d9d9", alpha=0.45, lw=0, label="±δ (the rule's margin)")
    ax.axvline(0.0, color="#000000", lw=0.8)
    for i, row in enumerate(rows):
        y, unit = len(rows) - 1 - i, row.margin if scaled else 1.0
        colour = method_color(row.variant)
        jitter = [((k * 0.618) % 1.0 - 0.5) * 0.36 for k in range(len(row.differences))]
        xs = [v / unit for v in row.differences]
        ys = [y + j for j in jitter]
        ax.scatter(xs, ys, s=16, color=colour, edgecolors="white", linewidths=0.4, zorder=2)
        low, high = row.descriptive
        if not math.isnan(low):
            ax.plot([low / unit, high / unit], [y, y], color=colour, lw=1.2, zorder=3)
        if row.design is not None and not math.isnan(row.design[0]):
            ax.plot(
                [row.design[0] / unit, row.design[1] / unit],
                [y, y],
                color=colour,
                lw=6,
                alpha=0.35,
                solid_capstyle="butt",
                zorder=1,
            )
        ax.plot([row.estimate / unit], [y], marker="D", ms=6, color=colour, mec="#000000", mew=0.6, zorder=4)
        ax.annotate(row.outcome, (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r.label for r in reversed(rows)], fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    levels = sorted({r.level for r in rows if r.level is not None})
    design = f"thick: the design's interval ({', '.join(f'{lv:.2%}' for lv in levels)})" if levels else ""
    in_margins = " / δ" if scaled else ""
    label = f"(variant - baseline){in_margins}: per seed (dots), mean (diamond); "
    label += "thin: descriptive 95% interval"
    ax.set_xlabel(textwrap.fill(label + (f"; {design}" if design else ""), 120), fontsize=8)
    ax.set_title(textwrap.fill(title, 110), fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    if band > 0:
        ax.legend(loc="lower left", fontsize=7, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight", facecolor="white")
    plt.close(fig)
    return path


def rule_label(rule: Any) -> str:
    """A rule's row label: its id and pair, then its metric."""
    return f"{rule.id}: {rule.variant} - {rule.baseline}\n{metric_label(rule)}"


def forest_rows(judged: Sequence[Any], differences: dict[str, list[float]]) -> list[ForestRow]:
    """Rows of ``semrl.studies.designs.Judged`` rules at one look, with the per-seed
    ``differences`` of that look (rule id -> differences)."""
    from semrl.studies.sequential import repeated_interval

    rows = []
    for j in judged:
        rule, d = j.rule, differences[j.rule.id]
        _, low, high = repeated_interval(d, 0.05)
        descriptive_only = math.isnan(j.level)
        rows.append(
            ForestRow(
                label=rule_label(rule),
                variant=rule.variant,
                estimate=j.estimate,
                design=None if descriptive_only else (j.low, j.high),
                level=None if descriptive_only else 1 - j.level,
                descriptive=(low, high),
                margin=rule.margin,
                outcome=j.outcome,
                differences=list(d),
            )
        )
    return rows
