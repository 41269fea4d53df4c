"""Compare runs step by step from their metrics.jsonl: a Markdown table and, with matplotlib
installed (``pip install -e .[plot]``), a PNG plot.

    python benchmarks/compare_runs.py runs/cmp_grpo runs/cmp_sent --metric entropy --png entropy.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load_metric(run_dir: Path, metric: str) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if metric in row:
            out[int(row["step"])] = float(row[metric])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--metric", nargs="+", default=["entropy"])
    parser.add_argument("--png", help="write a plot of the first metric here")
    args = parser.parse_args()
    for metric in args.metric:
        series = {run.name: load_metric(run, metric) for run in args.runs}
        steps = sorted({s for values in series.values() for s in values})
        print(f"\n{metric}\n\n| step | " + " | ".join(series) + " |\n|---|" + "---|" * len(series))
        for step in steps:
            cells = [f"{values[step]:.3f}" if step in values else "" for values in series.values()]
            print(f"| {step} | " + " | ".join(cells) + " |")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        metric = args.metric[0]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for run in args.runs:
            values = load_metric(run, metric)
            ax.plot(list(values), list(values.values()), marker="o", label=run.name)
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()
