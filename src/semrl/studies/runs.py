"""Run reports and run comparisons.

``write_report(run_dir)`` writes ``run_dir/report/index.html``: one self-contained page (styles,
script and data inlined; a Content-Security-Policy forbids any network request) with the training
and evaluation curves, the evaluation table and the reasoning-tree viewer over ``trees.jsonl``,
plus PNG curves in ``run_dir/report/figures`` when matplotlib is installed (``semrl[plot]``).

``compare_runs(run_dirs, out_dir)`` gives a side-by-side Markdown table of final metrics and
writes one PNG per metric with every run overlaid.
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from semrl.core.jsonl import log_exists, read_jsonl
from semrl.tracking import metric_names as names

logger = logging.getLogger(__name__)

__all__ = ["compare_runs", "load_metrics", "read_jsonl", "series", "write_report"]

TRAIN_METRICS = [
    names.REWARD,
    names.ACCURACY,
    names.ENTROPY,
    names.LOW_ENTROPY_FRAC,
    names.KL,
    names.RESPONSE_LENGTH,
    names.CORRECT_LENGTH,
    names.TRUNCATED_FRAC,
    names.DISTINCT_ANSWERS,
    names.CLIP_FRAC,
    names.GRAD_NORM,
    *names.ROSE,
    names.CURRICULUM_STAGE,
    names.STEP_S,
    *names.COST,  # the rollout's cost (docs/engines.md, "What a rollout costs")
]
COMPARE_METRICS = [
    names.REWARD,
    names.ACCURACY,
    names.ENTROPY,
    names.LOW_ENTROPY_FRAC,
    names.KL,
    names.RESPONSE_LENGTH,
    names.STEP_S,
]


def load_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not log_exists(path):
        raise FileNotFoundError(f"{path} does not exist: is '{run_dir}' a semrl run directory?")
    return read_jsonl(path)


def series(rows: Sequence[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    """(step, value) points of one metric, the last logged value of each step."""
    points: dict[int, float] = {}
    for row in rows:
        value = row.get(metric)
        if isinstance(value, (int, float)) and value == value:  # not NaN
            points[int(row["step"])] = float(value)
    return sorted(points.items())


def _eval_metric_names(rows: Sequence[dict[str, Any]]) -> list[str]:
    names = {k for row in rows for k in row if k.startswith("eval/")}

    def key(name: str) -> tuple[int, int, str]:
        base = name.removeprefix("eval/")
        kind, _, k = base.partition("@")
        rank = {"mean": 0, "pass": 1, "maj": 2}.get(kind, 3)
        return (rank, int(k) if k.isdigit() else 0, base)

    return sorted(names, key=key)


def _curated_eval_metrics(names: list[str]) -> list[str]:
    """The eval curves worth a chart: mean@n, pass@1, pass@n, maj@n, lengths, distinct answers."""
    keep = []
    for kind in ("mean", "pass", "maj"):
        ks = sorted(int(n.split("@")[1]) for n in names if n.startswith(f"eval/{kind}@"))
        keep += [f"eval/{kind}@{k}" for k in sorted({ks[0], ks[-1]})] if ks else []
    keep += [n for n in ("eval/response_length", "eval/distinct_answers") if n in names]
    return keep


# One colour per method in every figure semrl draws: Okabe and Ito's palette, which readers with
# red-green colour blindness tell apart (ROSE bluish green, SENT vermillion), then tab10's.
METHOD_COLORS = {
    "base model": "#000000",
    "dr_grpo": "#0072B2",
    "grpo": "#E69F00",
    "rose": "#009E73",
    "sent": "#D55E00",
    "treepo": "#CC79A7",
    "latr": "#56B4E9",
    "dapo": "#7f7f7f",
    "fr3e": "#8c564b",
    "seed_grpo": "#F0E442",
    "kl_cov": "#bcbd22",
    "clip_cov": "#17becf",
    "entropy_8020": "#9467bd",
}
OTHER_COLORS = ("#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")


def method_color(name: str) -> str:
    """The colour of ``name`` in every figure: a method's own (``METHOD_COLORS``), else one picked
    by a stable hash of the name, so that a variant keeps its colour from figure to figure."""
    import zlib

    if name in METHOD_COLORS:
        return METHOD_COLORS[name]
    return OTHER_COLORS[zlib.crc32(name.encode()) % len(OTHER_COLORS)]


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or None with a warning when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no PNG figures (pip install 'semrl[plot]')")
        return None
    return plt


def _plot_pngs(curves: dict[str, dict[str, list[tuple[int, float]]]], out_dir: Path) -> list[Path]:
    """One PNG per metric (runs overlaid); [] with a warning when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for metric, by_run in curves.items():
        if not any(by_run.values()):
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.2))
        for name, points in by_run.items():
            if points:
                ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    marker="o",
                    markersize=3,
                    label=name,
                    color=method_color(name),
                )
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if len(by_run) > 1:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / (metric.replace("/", "_").replace("@", "_at_") + ".png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def _eval_table(rows: Sequence[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Every evaluation step as a row; columns: mean@n, pass@k and maj@k for k in report_ks(n), length."""
    show = [n for n in names if not n.startswith(("eval/pass@", "eval/maj@")) or _in_report_ks(n, names)]
    show = [n for n in show if n not in ("eval/problems",)]
    eval_rows = [row for row in rows if any(n in row for n in names)]
    return {
        "columns": ["step", *(n.removeprefix("eval/") for n in show)],
        "rows": [[row["step"], *(row.get(n, "") for n in show)] for row in eval_rows],
    }


def _in_report_ks(name: str, names: list[str]) -> bool:
    """Whether eval/KIND@k is one of the k that tables show (the same k as ``semrl eval``'s)."""
    from semrl.evaluation import report_ks  # here: semrl.evaluation imports torch and transformers

    kind, k = name.split("@")
    n = max(int(other.split("@")[1]) for other in names if other.startswith(kind + "@"))
    return int(k) in report_ks(n)


def write_report(run_dir: str | Path, out_dir: str | Path | None = None, max_trees: int = 200) -> Path:
    """Write the HTML report (and PNG curves) of a run; returns the path of index.html."""
    run_dir = Path(run_dir)
    rows = load_metrics(run_dir)
    out = Path(out_dir) if out_dir else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    train_rows = [r for r in rows if r.get("step", 0) > 0 or "reward" in r]
    train_points = {m: series(train_rows, m) for m in TRAIN_METRICS}
    train_curves = [
        {"metric": m, "series": [{"name": run_dir.name, "points": points}]}
        for m, points in train_points.items()
        if points
    ]
    eval_names = _eval_metric_names(rows)
    eval_curves = [
        {"metric": m, "series": [{"name": run_dir.name, "points": series(rows, m)}]}
        for m in _curated_eval_metrics(eval_names)
    ]
    trees = read_jsonl(run_dir / "trees.jsonl")[-max_trees:]
    config_path = run_dir / "config.yaml"
    config_text = config_path.read_text() if config_path.exists() else ""
    steps = max((r.get("step", 0) for r in rows), default=0)
    config = yaml.safe_load(config_text) if config_text else {}
    method = (config.get("algorithm") or {}).get("method", "?")
    model = (config.get("model") or {}).get("name", "?")
    summary = f"{run_dir.name}: method {method}, model {model}, {steps} steps, {len(trees)} saved trees."
    data = {
        "title": run_dir.name,
        "summary": summary,
        "train_curves": train_curves,
        "eval_curves": eval_curves,
        "eval_table": _eval_table(rows, eval_names),
        "trees": trees,
        "config_text": config_text,
    }
    assets = resources.files("semrl.studies")
    page = assets.joinpath("template.html").read_text(encoding="utf-8")
    # JSON inside <script>: "</" would end the element, so escape it (and U+2028/9 for old parsers)
    payload = json.dumps(data).replace("</", "<\\/").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    for marker, value in (
        ("__STYLE__", assets.joinpath("style.css").read_text(encoding="utf-8")),
        ("__SCRIPT__", assets.joinpath("viewer.js").read_text(encoding="utf-8")),
        ("__TITLE__", html.escape(run_dir.name)),
        ("__DATA__", payload),
    ):
        page = page.replace(marker, value, 1)
    index = out / "index.html"
    tmp = index.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(index)
    drawn: list[Any] = train_curves + eval_curves
    curves = {c["metric"]: {run_dir.name: c["series"][0]["points"]} for c in drawn}
    _plot_pngs(curves, out / "figures")
    return index


def compare_runs(
    run_dirs: Sequence[str | Path], metrics: Sequence[str] | None = None, out_dir: str | Path | None = None
) -> str:
    """Markdown: final value of each metric per run (side by side) and a per-step table per
    metric; with ``out_dir``, one PNG per metric with all runs overlaid."""
    runs = {Path(d).name: load_metrics(Path(d)) for d in run_dirs}
    if len(runs) < len(run_dirs):
        raise ValueError("run directories must have distinct names to be told apart")
    if metrics is None:
        finals = [k for rows in runs.values() for row in rows[-1:] for k in row if k.startswith("eval/")]
        metrics = [*COMPARE_METRICS, *dict.fromkeys(m for m in finals if m in _curated_eval_metrics(finals))]
    curves = {m: {name: series(rows, m) for name, rows in runs.items()} for m in metrics}
    names = list(runs)
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for m in metrics:
        if any(curves[m].values()):
            cells = [f"{pts[-1][1]:.4g}" if pts else "" for pts in curves[m].values()]
            lines.append(f"| {m} (last) | " + " | ".join(cells) + " |")
    for m in metrics:
        steps = sorted({s for pts in curves[m].values() for s, _ in pts})
        if not steps:
            continue
        lines += ["", f"**{m}**", "", "| step | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        by_step = [dict(pts) for pts in curves[m].values()]
        for step in steps:
            cells = [f"{values[step]:.4g}" if step in values else "" for values in by_step]
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
    if out_dir is not None:
        written = _plot_pngs(curves, Path(out_dir))
        lines += ["", *(f"plot: {p}" for p in written)]
    return "\n".join(lines)
