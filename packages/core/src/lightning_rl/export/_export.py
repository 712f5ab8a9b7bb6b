"""The three exports: SFT examples, preference pairs and exact-token transitions, from a store to a file.

Each one streams: kept rollouts come a page (or a task group) at a time from ``_select``, become
records (``_formats``), are checked against the target format's rules (``_validate``) and go to a
sink (``_write``) that renames the file into place only when the whole export passed. Problems are
collected as one line per record; by default any problem means no file at all
(``ExportValidationError``), and ``skip_invalid=True`` writes the valid records and reports the rest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lightning_rl.algorithms.pairs import Pairing, build_pairs
from lightning_rl.export._formats import (
    Record,
    SftUnit,
    TargetFormat,
    preference_record,
    sft_call_records,
    sft_rollout_records,
    transition_record,
)
from lightning_rl.export._select import Selection, iter_groups, iter_samples
from lightning_rl.export._validate import (
    MAX_EXAMPLE_TOKENS,
    MAX_FILE_BYTES,
    MIN_OPENAI_EXAMPLES,
    ExportValidationError,
    check_preference_openai,
    check_preference_trl,
    check_sft_openai,
    check_sft_trl,
)
from lightning_rl.export._write import JsonlSink, ParquetSink, Sink
from lightning_rl.store.base import LightningStore

__all__ = ["ExportReport", "export_sft", "export_dpo", "export_transitions", "TransitionFormat"]

TransitionFormat = Literal["jsonl", "parquet"]
_MAX_PROBLEM_LINES = 1000
"""Problem lines kept in memory (the rest are counted): a broken store must not break the constant-memory promise."""

Checker = Callable[[dict[str, Any], "int | None", int], list[str]]


@dataclass
class ExportReport:
    """What an export wrote and what it left out."""

    path: Path
    records: int = 0
    rollouts: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list[str])
    """Records left out, one line each (invalid records with ``skip_invalid``, calls without text, ...)."""
    skipped_more: int = 0
    """Lines beyond the first 1000 that were only counted."""
    warnings: list[str] = field(default_factory=list[str])

    def summary(self) -> str:
        left = len(self.skipped) + self.skipped_more
        return f"wrote {self.records} records from {self.rollouts} rollouts to {self.path} ({self.bytes} bytes)" + (
            f"; left out {left}" if left else ""
        )


class _Run:
    """One export in progress: checks records, feeds the sink, keeps the report."""

    def __init__(
        self, sink: Sink, check: Checker | None, *, max_tokens: int, max_bytes: int, skip_invalid: bool
    ) -> None:
        self.sink, self.check = sink, check
        self.max_tokens, self.max_bytes, self.skip_invalid = max_tokens, max_bytes, skip_invalid
        self.report = ExportReport(sink.path)
        self.problems: list[str] = []
        self.problems_more = 0

    def note(self, line: str) -> None:
        """A record left out for a reason that is not a format error (kept in the report)."""
        if len(self.report.skipped) < _MAX_PROBLEM_LINES:
            self.report.skipped.append(line)
        else:
            self.report.skipped_more += 1

    def add(self, records: Iterable[Record]) -> None:
        for record in records:
            found = self.check(record.data, record.tokens, self.max_tokens) if self.check else []
            if found:
                for problem in found:
                    line = f"{record.ref}: {problem}"
                    if self.skip_invalid:
                        self.note(line)
                    elif len(self.problems) < _MAX_PROBLEM_LINES:
                        self.problems.append(line)
                    else:
                        self.problems_more += 1
                continue
            if not self.problems:  # once a problem is found nothing will be written: stop writing
                self.sink.write(record.data)
            self.report.records += 1
            if self.sink.bytes_written > self.max_bytes:
                self.sink.discard()
                raise ExportValidationError(
                    [f"{record.ref}: the file passed {self.max_bytes} bytes, the upload limit; narrow the selection"]
                )

    def finish(self) -> ExportReport:
        if self.problems:
            self.sink.discard()
            raise ExportValidationError(self.problems, self.problems_more)
        self.sink.commit()
        self.report.bytes = self.sink.path.stat().st_size
        return self.report

    def abort(self) -> None:
        self.sink.discard()


def _sink(out: str | os.PathLike[str], parquet: bool, kind: str) -> Sink:
    return ParquetSink(out, kind) if parquet else JsonlSink(out)


async def export_sft(
    store: LightningStore,
    out: str | os.PathLike[str],
    *,
    selection: Selection | None = None,
    fmt: TargetFormat = "openai",
    unit: SftUnit = "call",
    tools: list[dict[str, Any]] | None = None,
    max_tokens: int = MAX_EXAMPLE_TOKENS,
    max_bytes: int = MAX_FILE_BYTES,
    skip_invalid: bool = False,
) -> ExportReport:
    """Supervised examples: OpenAI chat JSONL (``fmt="openai"``) or a TRL parquet dataset (``"trl"``).

    ``unit="call"`` writes one example per kept call, ``"rollout"`` one per conversation of a role in
    a rollout. ``tools`` (OpenAI tool definitions) is written with every example whose call did not
    record its own (the gateway does not record the tools offered).
    """
    selection = selection or Selection()
    if unit not in ("call", "rollout"):
        raise ValueError(f"unit must be 'call' or 'rollout', got {unit!r}.")
    checker = _checker(fmt, check_sft_openai, check_sft_trl)
    run = _Run(
        _sink(out, fmt == "trl", f"sft_{unit}"),
        checker,
        max_tokens=max_tokens,
        max_bytes=max_bytes,
        skip_invalid=skip_invalid,
    )
    build = sft_call_records if unit == "call" else sft_rollout_records
    try:
        async for sample in iter_samples(store, selection):
            records, missing = build(sample.transitions, fmt, tools)
            for line in missing:
                run.note(line)
            run.add(records)
            run.report.rollouts += bool(records)
    except BaseException:
        run.abort()
        raise
    _warn_few(run.report, fmt)
    return run.finish()


async def export_dpo(
    store: LightningStore,
    out: str | os.PathLike[str],
    *,
    selection: Selection | None = None,
    fmt: TargetFormat = "openai",
    pairing: Pairing = "halves",
    margin: float = 0.0,
    tools: list[dict[str, Any]] | None = None,
    max_tokens: int = MAX_EXAMPLE_TOKENS,
    max_bytes: int = MAX_FILE_BYTES,
    skip_invalid: bool = False,
) -> ExportReport:
    """Preference pairs from each task group (``build_pairs``, one call per side): OpenAI preference JSONL
    or a TRL parquet dataset. Pairs whose two calls saw different messages are left out (both formats
    need one prompt for both sides) and listed in the report."""
    selection = selection or Selection()
    if selection.top_k is not None:
        raise ValueError("top_k does not apply to preference pairs (it would drop the rejected side); use pairing.")
    checker = _checker(fmt, check_preference_openai, check_preference_trl)
    run = _Run(
        _sink(out, fmt == "trl", "dpo"), checker, max_tokens=max_tokens, max_bytes=max_bytes, skip_invalid=skip_invalid
    )
    try:
        async for group in iter_groups(store, selection):
            built = build_pairs([s.as_rollout_sample() for s in group], pairing=pairing, margin=margin, unit="call")
            used: set[str] = set()
            for pair in built.pairs:
                record = preference_record(pair, fmt, tools)
                if isinstance(record, str):
                    run.note(record)
                    continue
                run.add([record])
                used |= {pair.chosen[0].rollout_id, pair.rejected[0].rollout_id}
            run.report.rollouts += len(used)
    except BaseException:
        run.abort()
        raise
    _warn_few(run.report, fmt)
    return run.finish()


async def export_transitions(
    store: LightningStore,
    out: str | os.PathLike[str],
    *,
    selection: Selection | None = None,
    fmt: TransitionFormat = "jsonl",
    max_bytes: int = MAX_FILE_BYTES,
) -> ExportReport:
    """Every kept call's exact token ids, logprobs and rewards (for a custom trainer or ``SFTTrainer``)."""
    selection = selection or Selection()
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"transitions are written as jsonl or parquet, not {fmt!r}.")
    run = _Run(_sink(out, fmt == "parquet", "transitions"), None, max_tokens=0, max_bytes=max_bytes, skip_invalid=True)
    try:
        async for sample in iter_samples(store, selection):
            records: list[Record] = []
            for t in sample.transitions:
                record = transition_record(t, sample.reward)
                if isinstance(record, str):
                    run.note(record)
                else:
                    records.append(record)
            run.add(records)
            run.report.rollouts += bool(records)
    except BaseException:
        run.abort()
        raise
    return run.finish()


def _checker(fmt: TargetFormat, openai: Checker, trl: Checker) -> Checker:
    if fmt == "openai":
        return openai
    if fmt == "trl":
        return trl
    raise ValueError(f"format must be 'openai' (JSONL) or 'trl' (parquet), got {fmt!r}.")


def _warn_few(report: ExportReport, fmt: TargetFormat) -> None:
    if fmt == "openai" and report.records < MIN_OPENAI_EXAMPLES:
        report.warnings.append(
            f"only {report.records} examples: OpenAI's fine-tuning refuses fewer than {MIN_OPENAI_EXAMPLES}"
        )
