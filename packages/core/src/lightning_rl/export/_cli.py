"""``lightning-rl export sft | dpo | transitions``: a store's rollouts as files other trainers read.

Kept free of heavy imports (the export modules load when a command runs), so ``lightning-rl --help``
stays instant. ``export sft --hosted URL --base-model NAME`` fine-tunes through a hosted API instead
of writing a file (``lightning_rl.export.hosted``). See docs/export.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from lightning_rl.export._export import ExportReport
    from lightning_rl.export._select import Selection
    from lightning_rl.store.base import LightningStore

__all__ = ["register", "parse_time"]

T = TypeVar("T")


def parse_time(value: str) -> float:
    """Unix seconds, or an ISO 8601 date/time (``2026-11-27``, ``2026-11-27T12:00:00+00:00``; naive is UTC)."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither Unix seconds nor an ISO date such as 2026-11-27T12:00:00"
        ) from None
    if when.tzinfo is None:
        from datetime import UTC

        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _selection_args(p: argparse.ArgumentParser, *, top_k: bool = True) -> None:
    p.add_argument("--store", required=True, help="The store: a SQLite path, sqlite:///…, postgresql://…, http(s)://…")
    p.add_argument("--min-reward", type=float, default=None, help="Keep rollouts with a final reward >= this.")
    p.add_argument("--mode", choices=("train", "val", "test"), default=None, help="Only rollouts of this mode.")
    p.add_argument(
        "--role", action="append", default=[], help="Only calls of this agent role (repeat for several roles)."
    )
    p.add_argument(
        "--trainable-only", action="store_true", help="Only calls of the roles the plugins declared trainable."
    )
    p.add_argument("--model-version", type=int, default=None, help="Only calls served by this model version.")
    p.add_argument("--since", type=parse_time, default=None, help="Rollouts that ended at/after this (ISO or Unix).")
    p.add_argument("--until", type=parse_time, default=None, help="Rollouts that ended before this (ISO or Unix).")
    if top_k:
        p.add_argument("--top-k", type=int, default=None, help="At most this many rollouts per task group, best first.")
    p.add_argument("--page-size", type=int, default=500, help="Rollouts read per store query (memory bound).")


def _format_args(p: argparse.ArgumentParser, choices: tuple[str, ...], what: str) -> None:
    p.add_argument("--out", default=None, help="The file to write (.jsonl or .parquet).")
    p.add_argument(
        "--format", choices=choices, default=None, help=f"{what} (default: from --out, .parquet is {choices[1]})."
    )


def _validation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tools", type=Path, default=None, help="A JSON file of OpenAI tool definitions written with every example."
    )
    p.add_argument("--max-tokens", type=int, default=None, help="Largest example in tokens (default 65536).")
    p.add_argument(
        "--skip-invalid", action="store_true", help="Write the valid records and list the invalid ones (default: fail)."
    )


def register(subparsers: Any) -> None:
    """Add ``export sft``, ``export dpo`` and ``export transitions`` to the ``lightning-rl`` parser."""
    export: argparse.ArgumentParser = subparsers.add_parser(
        "export", help="Export rollouts for other trainers: OpenAI fine-tuning JSONL, TRL parquet, token ids."
    )
    sub = export.add_subparsers(dest="export_command", required=True, metavar="EXPORT_COMMAND")

    sft = sub.add_parser(
        "sft",
        help="Supervised examples: OpenAI chat JSONL, or parquet for TRL's SFTTrainer.",
        description="Supervised examples from the selected calls. --hosted fine-tunes through a hosted "
        "/v1/fine_tuning/jobs API instead of writing a file, and publishes the model to the store.",
    )
    _selection_args(sft)
    _format_args(sft, ("openai", "trl"), "openai: chat fine-tuning JSONL; trl: parquet")
    sft.add_argument("--unit", choices=("call", "rollout"), default="call", help="One example per call or per rollout.")
    _validation_args(sft)
    hosted = sft.add_argument_group("hosted fine-tuning")
    hosted.add_argument("--hosted", metavar="BASE_URL", default=None, help="e.g. https://api.openai.com/v1")
    hosted.add_argument("--base-model", default=None, help="The model to fine-tune (with --hosted).")
    hosted.add_argument("--api-key-env", default="OPENAI_API_KEY", help="The variable holding the API key.")
    hosted.add_argument("--suffix", default=None, help="Added to the fine-tuned model's name.")
    hosted.add_argument("--epochs", type=int, default=None, help="Epochs (default: the provider's choice).")
    hosted.add_argument("--poll-max", type=float, default=60.0, help="Longest wait between status polls, seconds.")
    hosted.add_argument("--no-publish", action="store_true", help="Do not publish the model to the store.")
    sft.set_defaults(handler=_sft)

    dpo = sub.add_parser(
        "dpo",
        help="Preference pairs from each task group: OpenAI preference JSONL, or parquet for TRL's DPOTrainer.",
    )
    _selection_args(dpo, top_k=False)
    _format_args(dpo, ("openai", "trl"), "openai: preference fine-tuning JSONL; trl: parquet")
    dpo.add_argument(
        "--pairing", choices=("best_worst", "halves", "all"), default="halves", help="Which rollouts are paired."
    )
    dpo.add_argument("--margin", type=float, default=0.0, help="A pair needs a reward gap above this.")
    _validation_args(dpo)
    dpo.set_defaults(handler=_dpo)

    transitions = sub.add_parser(
        "transitions", help="Exact token ids, logprobs and rewards of each call (jsonl or parquet)."
    )
    _selection_args(transitions)
    _format_args(transitions, ("jsonl", "parquet"), "the file format")
    transitions.set_defaults(handler=_transitions)


def _selection(args: argparse.Namespace) -> Selection:
    from lightning_rl.export._select import Selection

    return Selection(
        min_reward=args.min_reward,
        mode=args.mode,
        roles=tuple(args.role),
        trainable_only=args.trainable_only,
        model_version=args.model_version,
        since=args.since,
        until=args.until,
        top_k=getattr(args, "top_k", None),
        page_size=args.page_size,
    )


def _format(args: argparse.Namespace, choices: tuple[str, str]) -> Any:
    """The --format choice, else what --out's suffix says (argparse checked it is one of ``choices``)."""
    if args.out is None:
        raise ValueError("--out is required: the file to write (.jsonl or .parquet).")
    if args.format is not None:
        return str(args.format)
    return choices[1] if str(args.out).endswith(".parquet") else choices[0]


def _tools(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    if args.tools is None:
        return None
    try:
        tools = json.loads(args.tools.read_text())
    except ValueError as exc:
        raise ValueError(f"--tools {args.tools}: not JSON ({exc}); give a list of OpenAI tool definitions.") from None
    if not isinstance(tools, list):
        raise ValueError(f"--tools {args.tools}: give a JSON list of OpenAI tool definitions.")
    return tools  # pyright: ignore[reportUnknownVariableType]


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    from lightning_rl.export._validate import MAX_EXAMPLE_TOKENS

    return {"max_tokens": args.max_tokens or MAX_EXAMPLE_TOKENS, "skip_invalid": args.skip_invalid}


_SHOW_LEFT_OUT = 20
"""Left-out records listed on stderr (the rest are counted): a pairing rule can leave out thousands."""


def _print(report: ExportReport) -> None:
    for line in report.skipped[:_SHOW_LEFT_OUT]:
        print(f"left out: {line}", file=sys.stderr)
    more = len(report.skipped) - _SHOW_LEFT_OUT + report.skipped_more
    if more > 0:
        print(f"left out: ... and {more} more like these", file=sys.stderr)
    for line in report.warnings:
        print(f"warning: {line}", file=sys.stderr)
    print(report.summary())


async def _with_store(url: str, work: Callable[[LightningStore], Awaitable[T]]) -> T:
    from lightning_rl.store import open_store

    store = await open_store(url)
    try:
        return await work(store)
    finally:
        await store.close()


def _sft(args: argparse.Namespace) -> int:
    from lightning_rl.export._export import export_sft

    if args.hosted:
        return _hosted(args)
    fmt = _format(args, ("openai", "trl"))
    report = asyncio.run(
        _with_store(
            args.store,
            lambda store: export_sft(
                store,
                args.out,
                selection=_selection(args),
                fmt=fmt,
                unit=args.unit,
                tools=_tools(args),
                **_limits(args),
            ),
        )
    )
    _print(report)
    return 0


def _dpo(args: argparse.Namespace) -> int:
    from lightning_rl.export._export import export_dpo

    fmt = _format(args, ("openai", "trl"))
    report = asyncio.run(
        _with_store(
            args.store,
            lambda store: export_dpo(
                store,
                args.out,
                selection=_selection(args),
                fmt=fmt,
                pairing=args.pairing,
                margin=args.margin,
                tools=_tools(args),
                **_limits(args),
            ),
        )
    )
    _print(report)
    return 0


def _transitions(args: argparse.Namespace) -> int:
    from lightning_rl.export._export import export_transitions

    fmt = _format(args, ("jsonl", "parquet"))
    report = asyncio.run(
        _with_store(args.store, lambda store: export_transitions(store, args.out, selection=_selection(args), fmt=fmt))
    )
    _print(report)
    return 0


def _hosted(args: argparse.Namespace) -> int:
    from lightning_rl.export.hosted import HostedFineTuningError, HostedSFT, HostedSFTConfig

    if not args.base_model:
        raise ValueError("--hosted needs --base-model, the model to fine-tune (e.g. gpt-4.1-mini-2025-04-14).")
    config = HostedSFTConfig(
        base_url=args.hosted,
        model=args.base_model,
        api_key_env=args.api_key_env,
        suffix=args.suffix,
        n_epochs=args.epochs,
        unit=args.unit,
        tools=_tools(args),
        poll_max_s=max(args.poll_max, 2.0),
        publish=not args.no_publish,
    )

    def status(name: str, job: dict[str, Any]) -> None:
        print(f"fine-tuning job {job.get('id')}: {name}", flush=True)

    try:
        job = HostedSFT(config, on_status=status).fit(args.store, _selection(args))
    except HostedFineTuningError as exc:  # the API's own words, on one line, as every CLI error
        print(f"lightning-rl: error: {exc}", file=sys.stderr)
        return 1
    _print(job.export)
    print(f"fine-tuned model: {job.fine_tuned_model}")
    if job.resources is not None:
        print(f"published as resources version {job.resources.version}: the next rollouts use it")
    return 0
