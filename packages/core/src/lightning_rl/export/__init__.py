"""Data out: the store's rollouts as files other trainers read, and SFT through a hosted fine-tuning API.

``lightning-rl export sft | dpo | transitions`` (``export._cli``) and the functions below select
rollouts and calls from any store (``Selection``), build records in the target format, check them
against that format's rules and write them a record at a time, so an export of any size runs in
constant memory. ``HostedSFT`` uploads an SFT export to an OpenAI-compatible ``/v1/fine_tuning/jobs``
API and publishes the fine-tuned model as the agent's LLM resource. See docs/export.md.

Importing this package is light (no torch, no pyarrow until a parquet file is written).
"""

from __future__ import annotations

from lightning_rl.export._export import ExportReport, TransitionFormat, export_dpo, export_sft, export_transitions
from lightning_rl.export._formats import Record, SftUnit, TargetFormat
from lightning_rl.export._select import ExportSample, Selection, iter_groups, iter_samples
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
from lightning_rl.export.hosted import HostedFineTuningError, HostedJob, HostedSFT, HostedSFTConfig

__all__ = [
    # selection
    "Selection",
    "ExportSample",
    "iter_samples",
    "iter_groups",
    # exports
    "export_sft",
    "export_dpo",
    "export_transitions",
    "ExportReport",
    "Record",
    "SftUnit",
    "TargetFormat",
    "TransitionFormat",
    # validation
    "ExportValidationError",
    "check_sft_openai",
    "check_preference_openai",
    "check_sft_trl",
    "check_preference_trl",
    "MAX_EXAMPLE_TOKENS",
    "MAX_FILE_BYTES",
    "MIN_OPENAI_EXAMPLES",
    # hosted fine-tuning
    "HostedSFT",
    "HostedSFTConfig",
    "HostedJob",
    "HostedFineTuningError",
]
