"""The side-by-side table the A/B benchmarks print: one row per measure, the median of each side's
readings and their ratio (docs/benchmarks.md: ratios from one run, not absolute timings)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence


def print_median_ratio_table(
    readings: Mapping[str, Sequence[Mapping[str, float]]], before: str, after: str, digits: int = 3
) -> None:
    """Print a markdown table of median(after) / median(before) for every measure of the readings.

    readings: side name -> one dict of measure -> seconds per repeat (every dict has the same keys).
    """
    print(f"| measure | {before} (median) | {after} (median) | {after} / {before} |")
    print("|---|---|---|---|")
    for measure in readings[before][0]:
        base = statistics.median(r[measure] for r in readings[before])
        other = statistics.median(r[measure] for r in readings[after])
        print(f"| {measure} | {base:.{digits}f} | {other:.{digits}f} | {other / base:.2f} |")
