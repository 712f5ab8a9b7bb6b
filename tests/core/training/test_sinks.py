"""Metric sinks: W&B (offline mode) and MLflow (a local file store) get the keys and steps of metrics.jsonl.

Real W&B and MLflow, no network: W&B writes its offline run under the run folder (what ``wandb
sync`` would upload later), MLflow a file store under the test's temporary folder, read back with
``MlflowClient``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lightning_rl.errors import MissingExtraError
from lightning_rl.trainer.metrics import MetricsLogger
from lightning_rl.trainer.sinks import LOGGERS, check_loggers

ROWS: list[dict[str, float]] = [
    {"step": 0.0, "val/reward_mean": 0.1, "val/n_rollouts": 4.0},
    {"step": 1.0, "train/reward_mean": 0.25, "train/loss": math.nan, "train/entropy": 1.5},
    {"step": 2.0, "train/reward_mean": 0.75, "train/loss": 0.5, "train/entropy": 1.25},
    {"step": 2.0, "val/reward_mean": 0.6, "val/n_rollouts": 4.0},
]


def _jsonl_points(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as key -> [(step, value)], finite values only (what sinks record)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key != "step" and math.isfinite(value):
                out.setdefault(key, []).append((int(row["step"]), value))
    return out


def _log_all(run_dir: Path, loggers: list[str], options: dict[str, dict[str, Any]]) -> None:
    logger = MetricsLogger(run_dir, loggers=loggers, config={"lr": 0.001, "backend": {"lora": False}},
                           logger_options=options)  # fmt: skip
    for row in ROWS:
        logger.log(row)
    logger.close()


def test_mlflow_file_store_gets_the_same_keys_and_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this opt-in
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    _log_all(tmp_path / "run", ["mlflow"], {"mlflow": {"tracking_uri": uri, "experiment_name": "calc"}})
    client = MlflowClient(tracking_uri=uri)
    experiment: Any = client.get_experiment_by_name("calc")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.001", "backend.lora": "False"}
    expected = _jsonl_points(tmp_path / "run")
    assert set(run.data.metrics) == set(expected) == {"val/reward_mean", "val/n_rollouts", "train/reward_mean",
                                                      "train/loss", "train/entropy"}  # fmt: skip
    for key, points in expected.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == sorted(points), key


# MLflow 3.17's SQL store uses a loader option SQLAlchemy 2.1 deprecates: MLflow's to fix, not ours.
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated:DeprecationWarning")
def test_mlflow_defaults_to_sqlite_in_the_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _log_all(tmp_path, ["mlflow"], {})
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment: Any = client.get_experiment_by_name("lightning-rl")
    (run,) = client.search_runs([experiment.experiment_id])
    assert set(run.data.metrics) == set(_jsonl_points(tmp_path))


def _wandb_records(path: Path) -> list[bytes]:
    """The records of a ``.wandb`` file: W&B's LevelDB-style log (7-byte file header, then 32 KiB
    blocks of chunks, each ``crc32:u32 length:u16 type:u8`` + data; FULL=1, FIRST=2, MIDDLE=3, LAST=4)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a .wandb file"
    records: list[bytes] = []
    pending = b""
    pos = 7
    while pos + 7 <= len(data):
        left_in_block = 32768 - pos % 32768
        if left_in_block < 7:  # a block's tail too short for a header is padding
            pos += left_in_block
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(pending)
            pending = b""
    return records


def _wandb_history(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Read the offline run's history back from the file ``wandb sync`` would upload."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    out: dict[str, list[tuple[int, float]]] = {}
    for data in _wandb_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") != "history":
            continue
        step = int(record.history.step.num)
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            if not key.startswith("_"):
                out.setdefault(key, []).append((step, json.loads(item.value_json)))
    return out


def test_wandb_offline_gets_the_same_keys_and_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    for var in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    _log_all(tmp_path, ["wandb"], {"wandb": {"mode": "offline", "project": "calc"}})
    import wandb

    wandb.teardown()  # the W&B service writes the run's file out when it stops (as at process exit)
    expected = _jsonl_points(tmp_path)
    history = _wandb_history(tmp_path)
    assert set(history) == set(expected)
    # W&B merges the rows of one step (train and validation at the same step) into one history row.
    for key, points in expected.items():
        assert sorted(history[key]) == sorted(points), key


def test_unknown_logger_and_options_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown logger 'comet'.*tensorboard, wandb, mlflow"):
        check_loggers(["comet"])
    with pytest.raises(ValueError, match="unknown mlflow options"):
        MetricsLogger(Path("unused"), loggers=["mlflow"], logger_options={"mlflow": {"uri": "x"}})
    assert check_loggers(["wandb", "wandb"]) == ("wandb",)
    assert LOGGERS == ("tensorboard", "wandb", "mlflow")


@pytest.mark.parametrize("name", LOGGERS)
def test_a_missing_sink_extra_names_its_pip_command_when_the_config_is_built(name: str) -> None:
    # TrainerConfig is checked at construction: the error comes before any training starts.
    code = (
        f"import sys; sys.modules[{name!r}] = None\n"
        "from lightning_rl.trainer.sinks import check_loggers\n"
        f"check_loggers([{name!r}])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    last = out.stderr.strip().splitlines()[-1]
    assert last == (
        f"lightning_rl.errors.MissingExtraError: TrainerConfig(loggers=[{name!r}]) needs {name} (not installed): "
        f"pip install 'lightning-rl[{name}]'"
    )


def test_trainer_config_checks_loggers() -> None:
    pytest.importorskip("torch")
    from lightning_rl.trainer import TrainerConfig

    assert TrainerConfig(loggers=["mlflow", "mlflow"]).loggers == ["mlflow"]
    with pytest.raises(ValueError, match="unknown logger"):
        TrainerConfig(loggers=["neptune"])
    with pytest.raises(ValueError, match="logger_options names unknown loggers"):
        TrainerConfig(logger_options={"neptune": {}})
    assert issubclass(MissingExtraError, ImportError)
