"""Output files written a record at a time: JSONL lines, or parquet row groups with a fixed schema.

Both write next to the destination (``NAME.partial``) and rename on success, so a file at the
destination is always a complete, validated export: a failed or interrupted export leaves nothing
that a trainer or an upload could mistake for the real thing.

Parquet columns have one schema for every row (what ``datasets`` and ``SFTTrainer`` expect), so
optional fields are null rather than absent, tool-call ``arguments`` stay the JSON text the model
produced (chat templates render a string as is) and ``tools`` is one JSON string per row (which
``SFTTrainer`` parses).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import orjson

from lightning_rl.extras import extra_import, install_command

__all__ = ["Sink", "JsonlSink", "ParquetSink", "parquet_schema", "ROW_GROUP"]

ROW_GROUP = 1000
"""Rows buffered per parquet row group: memory holds one group, whatever the export's size."""


class Sink(Protocol):
    path: Path
    bytes_written: int

    def write(self, data: dict[str, Any]) -> None: ...

    def commit(self) -> None: ...

    def discard(self) -> None: ...


class JsonlSink:
    """One JSON object per line (UTF-8, no spaces), written through to ``NAME.partial``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._partial = self.path.with_name(self.path.name + ".partial")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self._partial.open("wb")
        self.bytes_written = 0

    def write(self, data: dict[str, Any]) -> None:
        line = orjson.dumps(data) + b"\n"
        self._file.write(line)
        self.bytes_written += len(line)

    def commit(self) -> None:
        self._file.close()
        os.replace(self._partial, self.path)

    def discard(self) -> None:
        self._file.close()
        self._partial.unlink(missing_ok=True)


def parquet_schema(kind: str) -> Any:
    """The arrow schema of a parquet export: ``sft_call``, ``sft_rollout``, ``dpo`` or ``transitions``."""
    with extra_import(install_command(["export"]), "parquet export", ["pyarrow"]):
        import pyarrow as pa
    call = pa.struct(
        [
            ("id", pa.string()),
            ("type", pa.string()),
            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
        ]
    )
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", pa.string()),
        ]
    )
    messages = pa.list_(message)
    if kind == "sft_call":
        return pa.schema([("prompt", messages), ("completion", messages), ("tools", pa.string())])
    if kind == "sft_rollout":
        return pa.schema([("messages", messages), ("tools", pa.string())])
    if kind == "dpo":
        return pa.schema([("prompt", messages), ("chosen", messages), ("rejected", messages)])
    if kind == "transitions":
        ints = pa.list_(pa.int64())
        return pa.schema(
            [
                ("rollout_id", pa.string()),
                ("attempt_id", pa.string()),
                ("task_id", pa.string()),
                ("group_id", pa.string()),
                ("step_index", pa.int64()),
                ("role", pa.string()),
                ("model_version", pa.int64()),
                ("reward", pa.float64()),
                ("air_reward", pa.float64()),
                ("exact_tokens", pa.bool_()),
                ("truncated", pa.bool_()),
                ("prompt_ids", ints),
                ("response_ids", ints),
                ("response_logprobs", pa.list_(pa.float64())),
                ("input_ids", ints),
                ("completion_mask", ints),
            ]
        )
    raise ValueError(f"unknown parquet export kind {kind!r}")


class ParquetSink:
    """Rows buffered into row groups of ``ROW_GROUP`` and written with one fixed schema."""

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        with extra_import(install_command(["export"]), "parquet export", ["pyarrow"]):
            import pyarrow.parquet as pq
        self.path = Path(path)
        self._partial = self.path.with_name(self.path.name + ".partial")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._schema = parquet_schema(kind)
        self._writer: Any = pq.ParquetWriter(str(self._partial), self._schema)
        self._rows: list[dict[str, Any]] = []
        self.bytes_written = 0

    def write(self, data: dict[str, Any]) -> None:
        self._rows.append(data)
        if len(self._rows) >= ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        import pyarrow as pa

        self._writer.write_table(pa.Table.from_pylist(self._rows, schema=self._schema))
        self._rows = []
        self.bytes_written = self._partial.stat().st_size

    def commit(self) -> None:
        self._flush()
        self._writer.close()
        os.replace(self._partial, self.path)

    def discard(self) -> None:
        self._rows = []
        self._writer.close()
        self._partial.unlink(missing_ok=True)
