"""Comparing variants across seeds: a sweep directory (``OUT/VARIANT/seed-S``) or run directories
grouped by a config key.

- per-step mean and standard error over seeds of every logged metric (``aggregate.json``);
- final held-out (and transfer) metrics as mean +- s.e. (n seeds), with the base model's row;
- paired differences against a baseline variant with a 95% bootstrap interval that resamples seeds
  and, within each seed, problems (the runs of one seed share their held-out problems);
- the pass@k-vs-k curve of the base model and every variant, and per-step curves with s.e. bands.

Standard error: the sample standard deviation over seeds (ddof = 1) over sqrt(n); 0 for one seed.
docs/sweeps.md describes the output.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from semrl.jsonl import read_jsonl

DONE_FILE = (
    "sweep_done.json"  # semrl.sweep.DONE_FILE (not imported: the sweep module loads the config system)
)

logger = logging.getLogger(__name__)

SEED_DIR = re.compile(r"^seed-(\d+)$")
SPLITS = ("eval", "transfer")
CURVE_METRICS = [
    "reward",
    "accuracy",
    "entropy",
    "entropy/low_frac",
    "kl",
    "response_length",
    "response_length/correct",
    "reward/distinct_answers_per_group",
    "time/step_s",
]


@dataclass(frozen=True)
class Run:
    variant: str
    seed: int
    run_dir: Path
    rows: list[dict[str, Any]]

    def series(self, metric: str) -> dict[int, float]:
        """step -> the last value logged for that step."""
        out: dict[int, float] = {}
        for row in self.rows:
            value = row.get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                out[int(row["step"])] = float(value)
        return out

    def final(self, metric: str) -> float | None:
        points = self.series(metric)
        return points[max(points)] if points else None

    def eval_steps(self, split: str) -> list[int]:
        return sorted(self.series(f"{split}/problems"))


def _config_value(run_dir: Path, dotted: str) -> Any:
    config = (
        yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").exists() else {}
    )
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"{run_dir / 'config.yaml'} has no key '{dotted}' to group by")
        node = node[part]
    return node


def find_runs(paths: Sequence[str | Path], group_by: str | None = None) -> dict[str, list[Run]]:
    """Runs grouped into variants: one sweep directory (its ``VARIANT/seed-S`` runs), or run
    directories grouped by the config key ``group_by`` (seed: ``trainer.seed``)."""
    found: list[tuple[str, int, Path]] = []
    if group_by is None:
        if len(paths) != 1:
            raise ValueError(
                "give one sweep directory, or run directories with --group-by KEY (e.g. algorithm.method)"
            )
        root = Path(paths[0])
        for variant_dir in (
            sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
            if root.is_dir()
            else []
        ):
            for run_dir in sorted(variant_dir.iterdir()):
                match = SEED_DIR.match(run_dir.name)
                if match and (run_dir / "metrics.jsonl").exists():
                    found.append((variant_dir.name, int(match.group(1)), run_dir))
        # a sweep still running: only its finished runs (a half-run would bias the means)
        if any((run_dir / DONE_FILE).exists() for _, _, run_dir in found):
            unfinished = [r for r in found if not (r[2] / DONE_FILE).exists()]
            if unfinished:
                logger.warning(
                    "%d unfinished run(s) left out: %s",
                    len(unfinished),
                    ", ".join(f"{v}/seed-{s}" for v, s, _ in unfinished),
                )
            found = [r for r in found if (r[2] / DONE_FILE).exists()]
        if not found:
            raise FileNotFoundError(
                f"{root} holds no VARIANT/seed-S run with a metrics.jsonl: is it a sweep directory?"
            )
    else:
        for path in map(Path, paths):
            if not (path / "metrics.jsonl").exists():
                raise FileNotFoundError(
                    f"{path / 'metrics.jsonl'} does not exist: is '{path}' a semrl run directory?"
                )
            found.append((str(_config_value(path, group_by)), int(_config_value(path, "trainer.seed")), path))
    groups: dict[str, list[Run]] = {}
    for variant, seed, run_dir in found:
        if any(r.seed == seed for r in groups.get(variant, [])):
            raise ValueError(
                f"variant '{variant}' has two runs with seed {seed} ({run_dir}); group by another key"
            )
        groups.setdefault(variant, []).append(
            Run(variant, seed, run_dir, read_jsonl(run_dir / "metrics.jsonl"))
        )
    return {v: sorted(runs, key=lambda r: r.seed) for v, runs in groups.items()}


def mean_se(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, standard error, n): s.e. = sample std (ddof 1) / sqrt(n), 0 for a single value."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan, math.nan, 0
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
    return float(x.mean()), se, int(x.size)


def per_step(runs: Sequence[Run], metric: str) -> list[tuple[int, float, float, int]]:
    """(step, mean, s.e., n seeds) at every step some seed logged ``metric``."""
    by_run = [r.series(metric) for r in runs]
    steps = sorted({s for points in by_run for s in points})
    return [(s, *mean_se([p[s] for p in by_run if s in p])) for s in steps]


def aggregate(groups: dict[str, list[Run]]) -> dict[str, dict[str, list[tuple[int, float, float, int]]]]:
    """variant -> metric -> per-step (step, mean, s.e., n) for every metric any run logged."""
    out = {}
    for variant, runs in groups.items():
        metrics = sorted({k for r in runs for row in r.rows for k in row if k != "step"})
        out[variant] = {m: per_step(runs, m) for m in metrics}
    return out


# ----------------------------------------------------------------------------------------------
# Per-problem records and the paired bootstrap


def problem_scores(records: Sequence[dict[str, Any]], metric: str) -> dict[str, float]:
    """problem id -> that problem's ``metric`` ('mean@n', 'pass@k', 'response_length/correct' is not
    per problem): the unbiased pass@k of its samples, or its share of correct samples."""
    from semrl.evaluation import pass_at_k

    kind, _, k = metric.partition("@")
    out = {}
    for r in records:
        n, c = len(r["samples"]), sum(s["correct"] for s in r["samples"])
        if kind == "mean":
            out[r["id"]] = c / n
        elif kind == "pass":
            out[r["id"]] = pass_at_k(n, c, int(k))
        else:
            raise ValueError(f"no per-problem score for '{metric}'; use mean@n or pass@k")
    return out


def paired_bootstrap(
    differences: Sequence[np.ndarray], num_resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """Mean paired difference and its bootstrap interval. ``differences[s]`` holds the per-problem
    differences of seed s; each resample draws seeds with replacement and, within each drawn seed,
    its problems with replacement (a two-level bootstrap), and takes the mean over seeds of the
    per-seed means. Returns (estimate, low, high)."""
    if not differences or any(len(d) == 0 for d in differences):
        raise ValueError("the paired bootstrap needs at least one seed with at least one problem")
    rng = np.random.default_rng(seed)
    estimate = float(np.mean([d.mean() for d in differences]))
    stats = np.empty(num_resamples)
    num_seeds = len(differences)
    for b in range(num_resamples):
        drawn = rng.integers(0, num_seeds, num_seeds)
        stats[b] = np.mean(
            [differences[s][rng.integers(0, len(differences[s]), len(differences[s]))].mean() for s in drawn]
        )
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(stats, [tail, 100 - tail])
    return estimate, float(low), float(high)


def _records(run: Run, split: str, step: int) -> list[dict[str, Any]] | None:
    from semrl.evaluation import records_path

    path = records_path(run.run_dir, split, step)
    return read_jsonl(path) if path.exists() else None


def paired_differences(
    variant: Sequence[Run], baseline: Sequence[Run], split: str, metric: str, num_resamples: int = 2000
) -> tuple[float, float, float, int] | None:
    """(estimate, low, high, seeds) of variant - baseline on ``metric`` at each run's final
    evaluation, paired by seed and problem id; None without per-problem records."""
    base_by_seed = {r.seed: r for r in baseline}
    diffs = []
    for run in variant:
        other = base_by_seed.get(run.seed)
        if other is None or not run.eval_steps(split) or not other.eval_steps(split):
            continue
        mine, theirs = (
            _records(run, split, run.eval_steps(split)[-1]),
            _records(other, split, other.eval_steps(split)[-1]),
        )
        if mine is None or theirs is None:
            continue
        a, b = problem_scores(mine, metric), problem_scores(theirs, metric)
        shared = sorted(set(a) & set(b))
        if shared:
            diffs.append(np.array([a[p] - b[p] for p in shared]))
    if not diffs:
        return None
    return (*paired_bootstrap(diffs, num_resamples), len(diffs))


# ----------------------------------------------------------------------------------------------
# Tables and figures


def _num_samples(groups: dict[str, list[Run]], split: str) -> int:
    ks = [
        int(m.split("@")[1])
        for runs in groups.values()
        for r in runs
        for m in (r.rows[-1] if r.rows else {})
        if m.startswith(f"{split}/mean@")
    ]
    return max(ks, default=0)


def _fmt(mean: float, se: float, n: int, digits: int = 3) -> str:
    if n == 0 or mean != mean:
        return ""
    return f"{mean:.{digits}f} ± {se:.{digits}f} ({n})"


def _base_rows(groups: dict[str, list[Run]], split: str) -> dict[int, dict[str, float]]:
    """seed -> the step-0 evaluation row of ``split``: the base model, the same for every variant."""
    base: dict[int, dict[str, float]] = {}
    for runs in groups.values():
        for r in runs:
            first = next((row for row in r.rows if row.get("step") == 0 and f"{split}/problems" in row), None)
            if first is not None:
                base.setdefault(r.seed, first)
    return base


def _finished(runs: Sequence[Run], split: str) -> list[Run]:
    """The runs with an evaluation of ``split`` after training (their final one is read)."""
    return [r for r in runs if r.eval_steps(split) and r.eval_steps(split)[-1] > 0]


def final_table(groups: dict[str, list[Run]], split: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows: the base model (step 0, over every seed that evaluated it) and each variant's
    final evaluation, mean ± s.e. (n seeds)."""
    n = _num_samples(groups, split)
    if not n:
        return [], []
    ks = sorted({1, 2, 4, 8, 16, n} & set(range(1, n + 1)))
    metrics = [
        f"mean@{n}",
        *(f"pass@{k}" for k in ks),
        f"maj@{n}",
        "response_length",
        "response_length/correct",
        "distinct_answers",
        "truncated_frac",
    ]
    header = ["variant", *metrics]
    base = _base_rows(groups, split)
    rows = []
    if base:
        rows.append(
            [
                "base model (step 0)",
                *(
                    _fmt(*mean_se([b[f"{split}/{m}"] for b in base.values() if f"{split}/{m}" in b]))
                    for m in metrics
                ),
            ]
        )
    for variant, runs in groups.items():
        finals = _finished(runs, split)
        cells = [
            _fmt(*mean_se([v for r in finals if (v := r.final(f"{split}/{m}")) is not None])) for m in metrics
        ]
        rows.append([variant, *cells])
    return header, rows


def pass_at_k_curves(
    groups: dict[str, list[Run]], split: str
) -> dict[str, list[tuple[int, float, float, int]]]:
    """name -> (k, mean, s.e., n seeds) for k = 1..n: the base model (step 0) and each variant's
    final evaluation."""
    n = _num_samples(groups, split)
    curves: dict[str, list[tuple[int, float, float, int]]] = {}
    base = _base_rows(groups, split)
    if base:
        curves["base model"] = [
            (k, *mean_se([b[f"{split}/pass@{k}"] for b in base.values()])) for k in range(1, n + 1)
        ]
    for variant, runs in groups.items():
        finals = _finished(runs, split)
        if finals:
            curves[variant] = [
                (k, *mean_se([r.final(f"{split}/pass@{k}") for r in finals])) for k in range(1, n + 1)
            ]
    return curves


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _plots(groups: dict[str, list[Run]], out: Path, metrics: Sequence[str]) -> list[Path]:
    from semrl.report import pyplot

    plt = pyplot()
    if plt is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def band(ax: Any, points: list[tuple[int, float, float, int]], label: str) -> None:
        x = np.array([p[0] for p in points], dtype=float)
        m = np.array([p[1] for p in points])
        se = np.array([p[2] for p in points])
        (line,) = ax.plot(x, m, marker="o", markersize=2.5, label=label)
        ax.fill_between(x, m - se, m + se, color=line.get_color(), alpha=0.2, linewidth=0)

    for split in SPLITS:
        curves = pass_at_k_curves(groups, split)
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for name, points in curves.items():
            band(ax, points, name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k (samples per problem)")
        ax.set_ylabel(f"{'held-out' if split == 'eval' else 'transfer'} pass@k")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"pass_at_k_{split}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    for metric in metrics:
        lines = {v: [p for p in per_step(runs, metric) if p[0] > 0] for v, runs in groups.items()}
        if not any(lines.values()):
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.4))
        for variant, points in lines.items():
            if points:
                band(ax, points, variant)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{metric} (mean ± s.e. over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / (metric.replace("/", "_").replace("@", "_at_") + ".png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def compare_seeds(
    paths: Sequence[str | Path],
    output: str | Path | None = None,
    group_by: str | None = None,
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    num_resamples: int = 2000,
) -> str:
    """Markdown comparison of variants across seeds; with ``output``, also ``results.md``,
    ``aggregate.json``, PNG figures and a self-contained ``index.html`` there."""
    groups = find_runs(paths, group_by)
    if baseline is not None and baseline not in groups:
        raise ValueError(f"--baseline '{baseline}' is not a variant; the variants are {', '.join(groups)}")
    metrics = list(metrics or CURVE_METRICS)
    seeds = sorted({r.seed for runs in groups.values() for r in runs})
    sections: list[tuple[str, list[str], list[list[str]]]] = []
    for split in SPLITS:
        header, rows = final_table(groups, split)
        if rows:
            title = "Held-out problems" if split == "eval" else "Transfer split"
            sections.append((f"{title}: final evaluation, mean ± s.e. (n seeds)", header, rows))
            n = _num_samples(groups, split)
            curve = pass_at_k_curves(groups, split)
            ks = list(range(1, n + 1))
            sections.append(
                (
                    f"{title}: pass@k for k = 1..{n}, mean ± s.e.",
                    ["k", *curve],
                    [[str(k), *(_fmt(*pts[k - 1][1:]) for pts in curve.values())] for k in ks],
                )
            )
            if baseline is not None:
                diff_rows = []
                for variant, runs in groups.items():
                    if variant == baseline:
                        continue
                    for metric in (f"mean@{n}", "pass@1", f"pass@{n}"):
                        d = paired_differences(runs, groups[baseline], split, metric, num_resamples)
                        if d is not None:
                            est, lo, hi, used = d
                            diff_rows.append(
                                [
                                    variant,
                                    metric,
                                    f"{est:+.3f}",
                                    f"[{lo:+.3f}, {hi:+.3f}]",
                                    str(used),
                                    "yes" if lo > 0 or hi < 0 else "no",
                                ]
                            )
                if diff_rows:
                    sections.append(
                        (
                            f"{title}: paired difference against {baseline} "
                            "(95% bootstrap over seeds and problems)",
                            ["variant", "metric", "difference", "95% interval", "seeds", "excludes 0"],
                            diff_rows,
                        )
                    )
    per_step_tables = []
    for metric in metrics:
        lines = {v: {p[0]: p for p in per_step(runs, metric) if p[0] > 0} for v, runs in groups.items()}
        steps = sorted({s for pts in lines.values() for s in pts})
        if steps:
            rows = [
                [str(s), *(_fmt(*pts[s][1:]) if s in pts else "" for pts in lines.values())] for s in steps
            ]
            per_step_tables.append((f"{metric} per step, mean ± s.e. (n seeds)", ["step", *lines], rows))
    title = f"{len(groups)} variants x seeds {seeds}: " + ", ".join(
        f"{v} ({len(r)})" for v, r in groups.items()
    )
    md = [f"# {title}", ""]
    for heading, header, rows in [*sections, *per_step_tables]:
        md += [f"**{heading}**", "", *_markdown(header, rows), ""]
    if output is not None:
        out = Path(output)
        out.mkdir(parents=True, exist_ok=True)
        figures = _plots(groups, out / "figures", metrics)
        md += [f"![{p.stem}](figures/{p.name})" for p in figures]
        (out / "results.md").write_text("\n".join(md) + "\n", encoding="utf-8")
        (out / "aggregate.json").write_text(
            json.dumps(
                {
                    "seeds": {v: [r.seed for r in runs] for v, runs in groups.items()},
                    "per_step": aggregate(groups),
                    "pass_at_k": {s: pass_at_k_curves(groups, s) for s in SPLITS},
                },
                indent=1,
            )
        )
        body = [f"<h1>{html.escape(title)}</h1>"]
        for heading, header, rows in [*sections, *per_step_tables]:
            body += [f"<h3>{html.escape(heading)}</h3>", _html_table(header, rows)]
        for p in figures:
            data = base64.b64encode(p.read_bytes()).decode()
            body.append(
                f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,{data}"></figure>'
            )
        page = (
            '<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" '
            "content=\"default-src 'none'; img-src data:; style-src 'unsafe-inline'\">"
            f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
            "table{border-collapse:collapse;margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:2px 8px;"
            "text-align:right}img{max-width:48%}</style></head><body>" + "".join(body) + "</body></html>"
        )
        (out / "index.html").write_text(page, encoding="utf-8")
        md += ["", f"written: {out / 'results.md'}, {out / 'index.html'}, {out / 'aggregate.json'}"]
    return "\n".join(md)
