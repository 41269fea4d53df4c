"""Experiment trackers (``logging.report_to``): TensorBoard, Weights & Biases, Trackio, MLflow.

Each receives what ``metrics.jsonl`` and ``samples.jsonl`` receive: every step's metrics (the
``eval/*`` ones at evaluation steps), the resolved config once, and each step's sample
completions. Only the main process opens them. A resumed run continues the same tracker run: its
W&B / MLflow ids are kept in ``RUN_DIR/trackers.json``. W&B, Trackio and MLflow are optional extras
(``pip install 'semrl[wandb]'`` ...), checked when the config loads; where they write is theirs to
decide (``WANDB_MODE=offline``, ``TRACKIO_DIR``, ``MLFLOW_TRACKING_URI``), as in TRL and verl.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Protocol

IDS_FILE = "trackers.json"
SAMPLE_COLUMNS = ("step", "problem_id", "problem", "gold", "response", "tokens", "answer", "reward")


class Tracker(Protocol):
    """What a run sends to an experiment tracker: metrics, samples, and the close at the end."""

    def log_metrics(self, row: dict[str, float], step: int) -> None: ...

    def stored_through(self) -> int:
        """The last step this tracker's run already stores (-1: none, or it handles steps logged
        again itself). A resumed run re-runs the steps after its checkpoint; they are not sent
        again to a tracker that already stores them, which would keep both."""
        ...

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None: ...

    def close(self) -> None: ...


def _samples_markdown(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(SAMPLE_COLUMNS[1:]) + " |", "|" + "---|" * (len(SAMPLE_COLUMNS) - 1)]
    return "\n".join(
        lines + ["| " + " | ".join(cell(r.get(c)) for c in SAMPLE_COLUMNS[1:]) + " |" for r in rows]
    )


class TensorBoardTracker:
    """TensorBoard event files under ``RUN_DIR/tensorboard``: scalars, the config and samples as text."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```", 0)

    def log_metrics(self, row: dict[str, float], step: int) -> None:
        for key, value in row.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        self.writer.add_text("samples", _samples_markdown(rows), step)

    def stored_through(self) -> int:
        return -1  # TensorBoard drops the points of a restarted step range by itself ("purging")

    def close(self) -> None:
        self.writer.close()


class RunTracker:
    """A tracker with W&B's API: W&B itself and Trackio, which follows it (a run that logs a dict
    at a step, a ``Table`` of rows, ``finish``)."""

    def __init__(self, run: Any, table: Any, stored_steps: Any = None) -> None:
        """``stored_steps``: returns the steps the run already stores (Trackio); None for W&B,
        which refuses a step lower than one it has seen."""
        self.run, self.table, self.stored_steps = run, table, stored_steps

    def stored_through(self) -> int:
        return max(self.stored_steps(), default=-1) if self.stored_steps is not None else -1

    def log_metrics(self, row: dict[str, float], step: int) -> None:
        self.run.log(row, step=step)

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        table = self.table(
            columns=list(SAMPLE_COLUMNS), data=[[r.get(c) for c in SAMPLE_COLUMNS] for r in rows]
        )
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


def mlflow_key(key: str) -> str:
    """MLflow allows letters, digits, ``_ - . / :`` and spaces in names:
    ``eval/mean@8`` -> ``eval/mean_at_8``."""
    return re.sub(r"[^/\w.\- :]", "_", key.replace("@", "_at_"))


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value)[:6000]  # MLflow's limit on a parameter's value
    return flat


class MlflowTracker:
    """An MLflow run (``MLFLOW_TRACKING_URI`` decides where), continued on resume by its run id."""

    def __init__(self, config: dict[str, Any], project: str, name: str, run_id: str | None) -> None:
        import mlflow

        self.mlflow = mlflow
        if run_id is None:
            mlflow.set_experiment(project)
        self.run = mlflow.start_run(run_id=run_id, run_name=None if run_id else name)
        self.id = self.run.info.run_id
        if run_id is None:  # parameters are immutable in MLflow: logged once, by the first run
            mlflow.log_params(_flatten(config))

    def log_metrics(self, row: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({mlflow_key(k): v for k, v in row.items()}, step=step)

    def stored_through(self) -> int:
        from mlflow.tracking import MlflowClient

        return max((m.step for m in MlflowClient().get_metric_history(self.id, "reward")), default=-1)

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        self.mlflow.log_text("".join(json.dumps(r) + "\n" for r in rows), f"samples/step-{step:06d}.jsonl")

    def close(self) -> None:
        self.mlflow.end_run()


def open_trackers(
    names: list[str], run_dir: Path, config: dict[str, Any], project: str, run_name: str | None
) -> list[Tracker]:
    """Start the trackers of ``logging.report_to``; a run that was started before continues its
    tracker runs (ids read from ``RUN_DIR/trackers.json``, written here)."""
    ids_path = run_dir / IDS_FILE
    ids = json.loads(ids_path.read_text(encoding="utf-8")) if ids_path.exists() else {}
    name = run_name or run_dir.resolve().name
    trackers: list[Tracker] = []
    try:
        _open_each(names, run_dir, config, project, name, ids, trackers)
    except BaseException:  # a tracker that cannot start (a login, a server): close the ones started
        for started in trackers:
            started.close()
        raise
    if ids:
        ids_path.write_text(json.dumps(ids), encoding="utf-8")
    return trackers


def _open_each(
    names: list[str],
    run_dir: Path,
    config: dict[str, Any],
    project: str,
    name: str,
    ids: dict[str, str],
    trackers: list[Tracker],
) -> None:
    for tracker_name in names:
        if tracker_name == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir, config))
        elif tracker_name == "wandb":
            import wandb

            run = wandb.init(
                project=project,
                name=name,
                id=ids.get("wandb"),
                resume="allow",
                dir=str(run_dir),
                config=config,
            )
            ids["wandb"] = run.id
            trackers.append(RunTracker(run, wandb.Table))
        elif tracker_name == "trackio":
            import trackio
            from trackio.sqlite_storage import SQLiteStorage

            trackio_run = trackio.init(project=project, name=name, config=config, resume="allow", embed=False)

            def stored_steps(project: str = project, name: str = name) -> list[int]:
                logs = SQLiteStorage.get_logs(project, name)
                return [int(row["step"]) for row in logs if "step" in row]

            trackers.append(RunTracker(trackio_run, trackio.Table, stored_steps))
        elif tracker_name == "mlflow":
            mlflow_run = MlflowTracker(config, project, name, ids.get("mlflow"))
            ids["mlflow"] = mlflow_run.id
            trackers.append(mlflow_run)
