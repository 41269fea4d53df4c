"""logging.report_to: TensorBoard, W&B (offline), Trackio (local) and MLflow (a local SQLite store),
each read back with its own reader after a real 2-step run."""

from __future__ import annotations

import glob
import json
import struct
from pathlib import Path

import pytest

from semrl.cli import main
from semrl.config.load import load_config
from semrl.config.sections import ConfigError
from semrl.runtime.trainer import Trainer
from semrl.tracking.trackers import mlflow_key
from tests.helpers import read_metrics, tiny_run_config

KEYS = ("reward", "accuracy", "entropy", "loss", "response_length")


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)  # MLflow stores artifacts under ./mlruns of the working directory
    return tmp_path


def _wandb_records(run_dir: Path) -> list:
    """Records of every offline W&B run of ``run_dir``: the .wandb file is a LevelDB-style log
    (7-byte header, 32 KiB blocks of [crc32, length, type] chunks) of protobuf records."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for path in sorted(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))):
        data = Path(path).read_bytes()
        assert data[:4] == b":W&B"
        pos, chunks = 7, b""
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if left < 7 or (kind == 0 and length == 0):
                pos += left
                continue
            chunks, pos = chunks + data[pos + 7 : pos + 7 + length], pos + 7 + length
            if kind in (1, 4):  # a full record, or the last chunk of one
                record = pb.Record()
                record.ParseFromString(chunks)
                out.append(record)
                chunks = b""
    return out


def _wandb_history(records) -> dict[int, dict]:
    rows: dict[int, dict] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            rows.setdefault(items["_step"], {}).update(items)
    return rows


def test_each_tracker_receives_the_metrics_the_config_and_the_samples(digit_model_dir, seven_task, offline):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from trackio import SQLiteStorage

    out = offline / "run"
    cfg = tiny_run_config(
        digit_model_dir,
        seven_task,
        out,
        "trainer.steps=2",
        "logging.project=semrl-test",
        "logging.run_name=two-steps",
        "logging.report_to=[tensorboard,wandb,trackio,mlflow]",
        "logging.samples_per_step=3",
    )
    Trainer(cfg).train()
    expected = {m["step"]: m for m in read_metrics(out)}
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted(expected) == [1, 2] and len(samples) == 6

    # TensorBoard
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    for key in KEYS:
        assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars(key)] == [
            (s, expected[s][key]) for s in (1, 2)
        ]
    text = {
        t: [e.tensor_proto.string_val[0].decode() for e in events.Tensors(t)]
        for t in ("config/text_summary", "samples/text_summary")
    }
    assert "tiny-digits" in text["config/text_summary"][0]
    assert samples[0]["response"].replace("|", "\\|") in text["samples/text_summary"][0]

    # W&B (offline run in RUN_DIR/wandb)
    records = _wandb_records(out)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.project, run.display_name) == ("semrl-test", "two-steps")
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["model"]["name"] == str(digit_model_dir)
    history = _wandb_history(records)
    for step in (1, 2):
        assert {k: history[step][k] for k in KEYS} == {k: expected[step][k] for k in KEYS}
        table = json.loads(
            Path(
                glob.glob(str(out / "wandb" / "offline-run-*" / "files" / history[step]["samples/path"]))[0]
            ).read_text()
        )
        assert [dict(zip(table["columns"], row, strict=True)) for row in table["data"]] == [
            s for s in samples if s["step"] == step
        ]

    # Trackio (TRACKIO_DIR)
    logs = SQLiteStorage.get_logs("semrl-test", "two-steps")
    scalars = {row["step"]: row for row in logs if "reward" in row}
    assert {s: {k: scalars[s][k] for k in KEYS} for s in (1, 2)} == {
        s: {k: expected[s][k] for k in KEYS} for s in (1, 2)
    }
    logged = [row["samples"] for row in logs if "samples" in row]
    assert len(logged) == 2 and "Pick a number" in json.dumps(logged[0])
    assert SQLiteStorage.get_run_config("semrl-test", "two-steps")["model"]["name"] == str(digit_model_dir)

    # MLflow (the SQLite store of MLFLOW_TRACKING_URI)
    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("semrl-test").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "two-steps"
    run_id = runs[0].info.run_id
    assert json.loads(runs[0].data.params["model.name"]) == str(digit_model_dir)
    for key in KEYS:
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, key)] == [
            (s, expected[s][key]) for s in (1, 2)
        ]
    stored = Path(
        client.download_artifacts(run_id, "samples/step-000002.jsonl", str(offline / "dl"))
    ).read_text()
    assert [json.loads(line) for line in stored.splitlines()] == [s for s in samples if s["step"] == 2]
    assert json.loads((out / "trackers.json").read_text()) == {"wandb": run.run_id, "mlflow": run_id}


def test_a_resumed_run_continues_its_tracker_runs(digit_model_dir, seven_task, offline):
    from mlflow.tracking import MlflowClient

    out = offline / "run"
    trackers = "logging.report_to=[wandb,mlflow]"
    Trainer(
        tiny_run_config(
            digit_model_dir, seven_task, out, "trainer.steps=1", trackers, "logging.project=resumed"
        )
    ).train()
    assert main(["train", "--resume", str(out), "trainer.steps=2", "logging.progress=false"]) == 0
    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("resumed").experiment_id])
    assert len(runs) == 1
    rewards = [m["reward"] for m in read_metrics(out)]
    assert [(m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, "reward")] == [
        (1, rewards[0]),
        (2, rewards[1]),
    ]
    ids = {r.run.run_id for r in _wandb_records(out) if r.WhichOneof("record_type") == "run"}
    assert ids == {json.loads((out / "trackers.json").read_text())["wandb"]}
    assert len(glob.glob(str(out / "wandb" / "offline-run-*"))) == 2  # one offline segment per process run


def test_steps_run_again_after_a_resume_reach_mlflow_and_trackio_once(digit_model_dir, seven_task, offline):
    import shutil

    from mlflow.tracking import MlflowClient
    from trackio import SQLiteStorage

    out = offline / "run"
    cfg = tiny_run_config(
        digit_model_dir,
        seven_task,
        out,
        "trainer.steps=3",
        "logging.save_every=1",
        "logging.keep_last=5",
        "logging.report_to=[mlflow,trackio]",
        "logging.project=once",
        "logging.run_name=once",
    )
    Trainer(cfg).train()
    # the newest checkpoint is gone (as when it is damaged): the resume starts from step 2 and runs step 3 again
    shutil.rmtree(out / "checkpoints" / "step-000003")
    assert main(["train", "--resume", str(out), "logging.progress=false"]) == 0
    rewards = {m["step"]: m["reward"] for m in read_metrics(out)}
    assert sorted(rewards) == [1, 2, 3]
    client = MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("once").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward")] == sorted(
        rewards.items()
    )
    logs = SQLiteStorage.get_logs("once", "once")
    assert sorted((row["step"], row["reward"]) for row in logs if "reward" in row) == sorted(rewards.items())
    assert sorted(row["step"] for row in logs if "samples" in row) == [1, 2, 3]


def test_tracker_names_are_checked_when_the_config_loads(monkeypatch):
    with pytest.raises(ConfigError, match="unknown tracker 'tensorbord'"):
        load_config(None, ["logging.report_to=[tensorbord]"])
    import importlib.util

    find_spec = importlib.util.find_spec  # wandb as if not installed
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'semrl\[wandb\]'"):
        load_config(None, ["logging.report_to=[wandb]"])


def test_the_removed_tensorboard_key_is_an_unknown_key():
    """0.1's `logging.tensorboard` is gone (0.2.0): an unknown key, whose message lists report_to."""
    with pytest.raises(ConfigError, match="unknown config key 'logging.tensorboard'.*report_to"):
        load_config(None, ["logging.tensorboard=false"])


def test_mlflow_keys_keep_what_mlflow_allows():
    assert mlflow_key("eval/mean@8") == "eval/mean_at_8"
    assert mlflow_key("eval/arithmetic/pass@k(8)") == "eval/arithmetic/pass_at_k_8_"
    assert mlflow_key("actor/grad_norm") == "actor/grad_norm"
