"""Metric sinks besides ``metrics.jsonl``: TensorBoard, Weights & Biases, MLflow.

``metrics.jsonl`` is always written (greppable, diffable, the record of truth); a sink mirrors each
row under the same keys (``train/reward_mean``, ``val/reward_mean``, ...) at the row's ``step``, so a
curve in W&B or MLflow is the same curve as in the file. Non-finite values (NaN: "no data this
step") are left out of every sink, as TensorBoard would not plot them anyway.

Each sink is an optional extra (``lightning-rl[wandb]``, ``[mlflow]``, ``[tensorboard]``), imported
only here and only when asked for; :func:`check_loggers` runs when the ``TrainerConfig`` is built,
so a missing extra is one line naming the pip command before any training starts.

Where the data goes, by default (explicit ``logger_options`` and the tools' own environment
variables win):

* ``tensorboard``: ``<run_dir>/tensorboard``;
* ``wandb``: a run in project ``lightning-rl`` named after the run folder, its files under
  ``<run_dir>``; ``WANDB_MODE=offline`` (or ``logger_options={"wandb": {"mode": "offline"}}``)
  keeps it on disk for a later ``wandb sync``;
* ``mlflow``: ``MLFLOW_TRACKING_URI`` when set, else a SQLite store ``<run_dir>/mlflow.db`` (MLflow's
  own default is ``mlflow.db`` in the working directory; a run should not write outside its
  folder unless told to); experiment ``lightning-rl``. ``mlflow ui --backend-store-uri
  sqlite:///<run_dir>/mlflow.db`` shows it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from lightning_rl.extras import require_extra

__all__ = ["LOGGERS", "MetricSink", "check_loggers", "open_sinks", "TensorBoardSink", "WandbSink", "MLflowSink"]

LOGGERS = ("tensorboard", "wandb", "mlflow")
"""The sink names ``TrainerConfig(loggers=[...])`` accepts (each also the name of its extra)."""

DEFAULT_PROJECT = "lightning-rl"
"""The W&B project and MLflow experiment of a run, unless ``logger_options`` says otherwise."""


class MetricSink(Protocol):
    """Where a row of metrics goes besides ``metrics.jsonl``."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record the finite ``metrics`` (``step`` excluded) at ``step``."""
        ...

    def close(self) -> None:
        """Flush and finish the run; called once, at the end of training."""
        ...


def check_loggers(names: Iterable[str]) -> tuple[str, ...]:
    """Validate sink names and that their extras are installed; returns them without duplicates.

    Raises:
        ValueError: An unknown name (the message lists the known ones).
        MissingExtraError: A sink's extra is not installed (the message names the pip command).
    """
    out: list[str] = []
    for name in names:
        if name not in LOGGERS:
            raise ValueError(f"unknown logger {name!r}; TrainerConfig.loggers takes any of {', '.join(LOGGERS)}.")
        if name not in out:
            require_extra(name, feature=f"TrainerConfig(loggers=[{name!r}])")
            out.append(name)
    return tuple(out)


def finite(metrics: Mapping[str, float]) -> dict[str, float]:
    """The finite values of ``metrics`` without ``step``: what every sink records."""
    return {k: v for k, v in metrics.items() if k != "step" and math.isfinite(v)}


def _params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten a nested config into ``a.b -> str(value)`` (MLflow params are flat strings)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_params(value, f"{name}."))  # pyright: ignore[reportUnknownArgumentType]
        else:
            out[name] = str(value)[:6000]  # MLflow's limit on a param value
    return out


class TensorBoardSink:
    """Scalars in ``<run_dir>/tensorboard`` (torch's ``SummaryWriter``)."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # pyright: ignore[reportMissingImports]

        self._writer: Any = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in finite(metrics).items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """One Weights & Biases run; ``options`` go to ``wandb.init`` (project, entity, mode, tags, ...)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        import wandb

        settings: dict[str, Any] = {
            "project": os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            "name": run_dir.resolve().name,
            "dir": str(run_dir),
            "config": dict(config),
            "reinit": "create_new",  # a second Trainer in the same process gets its own run
        }
        settings.update(options)
        self._run: Any = wandb.init(**settings)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(finite(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class MLflowSink:
    """One MLflow run, through ``MlflowClient`` (no global "active run", so trainers never mix).

    ``options``: ``tracking_uri``, ``experiment_name`` (default ``lightning-rl``), ``run_name``
    (default: the run folder's name), ``tags`` (a dict).
    """

    def __init__(self, run_dir: Path, config: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        known = {"tracking_uri", "experiment_name", "run_name", "tags"}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown mlflow options {sorted(unknown)}; use any of {sorted(known)}.")
        uri = options.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.tracking_uri: str = uri
        self._client: Any = MlflowClient(tracking_uri=uri)
        experiment = options.get("experiment_name") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        found: Any = self._client.get_experiment_by_name(experiment)
        experiment_id: str = found.experiment_id if found is not None else self._client.create_experiment(experiment)
        tags = {str(k): str(v) for k, v in dict(options.get("tags") or {}).items()}
        run: Any = self._client.create_run(
            experiment_id, run_name=options.get("run_name") or run_dir.resolve().name, tags=tags
        )
        self.run_id: str = run.info.run_id
        params = [Param(k, v) for k, v in _params(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self._client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in finite(metrics).items()]
        if batch:
            self._client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def open_sinks(
    names: Sequence[str],
    run_dir: Path,
    *,
    config: Mapping[str, Any] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[MetricSink]:
    """Start one sink per name (validated by :func:`check_loggers`), in the given order.

    Args:
        names: Sink names, a subset of :data:`LOGGERS`.
        run_dir: The run folder (created if absent).
        config: The run's configuration, recorded by W&B (config) and MLflow (params).
        options: Per-sink settings, e.g. ``{"wandb": {"mode": "offline"}}``.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    config = config or {}
    options = options or {}
    unknown = set(options) - set(LOGGERS)
    if unknown:
        raise ValueError(f"logger_options for unknown loggers {sorted(unknown)}; known: {', '.join(LOGGERS)}.")
    sinks: list[MetricSink] = []
    try:
        for name in check_loggers(names):
            opts = options.get(name, {})
            if name == "tensorboard":
                sinks.append(TensorBoardSink(run_dir))
            elif name == "wandb":
                sinks.append(WandbSink(run_dir, config, opts))
            else:
                sinks.append(MLflowSink(run_dir, config, opts))
    except BaseException:
        for sink in sinks:  # a later sink failed to start: finish the runs already opened
            sink.close()
        raise
    return sinks
