"""``lightning-rl export``: selection, the formats' shapes, validation before writing, and the CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from lightning_rl import semconv
from lightning_rl.cli import main
from lightning_rl.export import (
    ExportValidationError,
    Selection,
    check_preference_openai,
    check_sft_openai,
    export_dpo,
    export_sft,
    export_transitions,
    iter_samples,
)
from lightning_rl.store.base import LightningStore
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.testing.synthetic_store import FAKE_CALCULATOR_TOOL
from lightning_rl.types import AttemptStatus, RolloutRequest, Span, Task

T = TypeVar("T")


def on_store(path: Path, work: Callable[[LightningStore], Awaitable[T]]) -> T:
    async def run() -> T:
        store = SQLiteStore(path)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sft_openai_per_call_writes_valid_chat_lines_of_the_kept_rollouts(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    report = on_store(
        store_path,
        lambda s: export_sft(s, out, selection=Selection(min_reward=1.0), tools=[FAKE_CALCULATOR_TOOL]),
    )
    records = lines(out)
    assert report.records == len(records) == 24 * 2 and report.rollouts == 24
    assert all(check_sft_openai(r, None) == [] for r in records)
    first, second = records[0], records[1]
    # the first call asks for the tool; the second reports its result after the tool message
    assert first["messages"][-1]["tool_calls"][0]["function"]["name"] == "calculator"
    assert first["messages"][-1]["content"] is None and first["tools"] == [FAKE_CALCULATOR_TOOL]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert second["messages"][2]["weight"] == 0, "an earlier turn is context: only the last message trains"
    assert "weight" not in second["messages"][-1]
    assert second["messages"][3]["tool_call_id"] == second["messages"][2]["tool_calls"][0]["id"]
    assert all(r["messages"][-1].get("content") != "The answer is 0." for r in records)


def test_sft_per_rollout_trains_every_turn_the_rollout_produced(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    report = on_store(store_path, lambda s: export_sft(s, out, selection=Selection(min_reward=1.0), unit="rollout"))
    records = lines(out)
    assert report.records == len(records) == 24
    for record in records:
        assistants = [m for m in record["messages"] if m["role"] == "assistant"]
        assert [m["weight"] for m in assistants] == [1, 1], "both calls of the rollout are its own responses"
        assert check_sft_openai(record, None) == []


def test_filters_select_by_mode_role_version_time_and_top_k(store_path: Path, tmp_path: Path) -> None:
    def count(selection: Selection) -> tuple[int, int]:
        async def run(store: LightningStore) -> tuple[int, int]:
            rollouts = calls = 0
            async for sample in iter_samples(store, selection):
                rollouts += 1
                calls += len(sample.transitions)
            return rollouts, calls

        return on_store(store_path, run)

    assert count(Selection()) == (48, 96)
    assert count(Selection(min_reward=1.0)) == (24, 48)
    assert count(Selection(top_k=1)) == (12, 24), "the best rollout of each task"
    assert count(Selection(mode="val")) == (0, 0)
    assert count(Selection(roles=("solver",))) == (48, 96)
    assert count(Selection(roles=("critic",))) == (48, 0), "rollouts are read, no call is kept"
    assert count(Selection(model_version=2)) == (48, 0)
    assert count(Selection(until=time.time() - 3600)) == (0, 0)
    assert count(Selection(since=time.time() - 3600)) == (48, 96)
    assert count(Selection(page_size=5)) == (48, 96), "paging does not change what is read"
    # the fake agent declares no trainable role, so the adapter keeps every call (as the trainer would)
    assert count(Selection(trainable_only=True)) == (48, 96)


def test_bad_selections_are_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        Selection(top_k=0)
    with pytest.raises(ValueError, match="mode must be train, val or test"):
        Selection(mode="eval")
    with pytest.raises(ValueError, match="the time range is empty"):
        Selection(since=10.0, until=5.0)


def test_dpo_pairs_share_a_prompt_and_prefer_the_higher_reward(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "dpo.jsonl"
    report = on_store(store_path, lambda s: export_dpo(s, out, pairing="best_worst"))
    records = lines(out)
    # best_worst: one pair per task group at call 0 (same prompt); call 1 saw different tool results
    assert report.records == len(records) == 12
    assert len(report.skipped) == 12 and all("saw different messages" in line for line in report.skipped)
    for record in records:
        assert check_preference_openai(record, None) == []
        assert [m["role"] for m in record["input"]["messages"]] == ["system", "user"]
        assert record["preferred_output"][0]["role"] == "assistant"
    assert "top_k does not apply" in str(
        pytest.raises(
            ValueError, on_store, store_path, lambda s: export_dpo(s, out, selection=Selection(top_k=1))
        ).value
    )


async def _add_broken_rollout(store: LightningStore) -> str:
    """A succeeded rollout whose call asked for a tool with no name and unparsable arguments."""
    [rollout] = await store.enqueue([RolloutRequest(id="ro-broken", task=Task(input="x"), group_id="g-broken")])
    [claim] = await store.claim("w")
    calls = [{"id": "call_x", "name": "", "arguments": "{not json"}]
    attrs: dict[str, Any] = {
        semconv.GEN_AI_INPUT_MESSAGES: json.dumps([{"role": "user", "content": "x"}]),
        semconv.PROMPT_TOKEN_IDS: [1, 2],
        semconv.RESPONSE_TOKEN_IDS: [3],
        semconv.TOOL_CALLS: json.dumps(calls),
        semconv.RESPONSE_CONTENT: None,
    }
    span = Span(name=semconv.SPAN_LLM_CALL, attributes=attrs, rollout_id=rollout.id, attempt_id=claim.attempt.id)
    await store.add_spans([span])
    await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    return span.span_id


def test_invalid_records_are_reported_one_line_each_and_nothing_is_written(store_path: Path, tmp_path: Path) -> None:
    span_id = on_store(store_path, _add_broken_rollout)
    out = tmp_path / "sft.jsonl"
    with pytest.raises(ExportValidationError) as err:
        on_store(store_path, lambda s: export_sft(s, out))
    problems = err.value.problems
    assert len(problems) == 2 and all(p.startswith(f"rollout ro-broken call 0 (span {span_id}): ") for p in problems)
    assert any("function has no name" in p for p in problems)
    assert any("arguments are not valid JSON" in p for p in problems)
    assert not out.exists() and not list(tmp_path.glob("*.partial")), "a failed export leaves no file"

    report = on_store(store_path, lambda s: export_sft(s, out, skip_invalid=True))
    assert report.records == 96 and len(lines(out)) == 96
    assert len(report.skipped) == 2 and all("ro-broken" in line for line in report.skipped)


def test_examples_over_the_token_limit_are_refused(store_path: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportValidationError, match="tokens, over the 10-token limit"):
        on_store(store_path, lambda s: export_sft(s, tmp_path / "x.jsonl", max_tokens=10))


def test_the_message_rules_name_each_problem() -> None:
    record = {
        "messages": [
            {"role": "wizard", "content": "hi"},
            {"role": "user", "content": "q", "weight": 1},
            {"role": "tool", "content": "4", "tool_call_id": "call_missing"},
            {"role": "assistant", "content": "", "weight": 2},
        ],
        "extra": 1,
    }
    problems = check_sft_openai(record, 70_000)
    expected = [
        "unknown top-level keys ['extra']",
        "message 0: role 'wizard' is not one of",
        "message 1: weight is allowed only on assistant messages",
        "message 2: tool message answers 'call_missing', which no earlier assistant tool call has",
        "message 3: assistant message has neither content nor tool_calls",
        "message 3: weight must be 0 or 1, got 2",
        "no assistant message to train on",
        "70000 tokens, over the 65536-token limit",
    ]
    for want in expected:
        assert any(p.startswith(want) for p in problems), (want, problems)


def test_transitions_keep_the_exact_token_ids_and_the_rewards(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    report = on_store(store_path, lambda s: export_transitions(s, out, selection=Selection(top_k=1)))
    records = lines(out)
    assert report.records == len(records) == 24
    for r in records:
        assert r["input_ids"] == r["prompt_ids"] + r["response_ids"]
        assert r["completion_mask"] == [0] * len(r["prompt_ids"]) + [1] * len(r["response_ids"])
        assert r["reward"] == 1.0 and r["exact_tokens"] and len(r["response_logprobs"]) == len(r["response_ids"])


def test_parquet_exports_load_with_datasets_in_trl_shapes(store_path: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    data_utils = pytest.importorskip("trl.data_utils")

    on_store(store_path, lambda s: export_sft(s, tmp_path / "sft.parquet", fmt="trl", tools=[FAKE_CALCULATOR_TOOL]))
    sft = datasets.load_dataset("parquet", data_files=str(tmp_path / "sft.parquet"), split="train")
    assert sft.column_names == ["prompt", "completion", "tools"] and len(sft) == 96
    assert data_utils.is_conversational(sft[0]) and json.loads(sft[0]["tools"]) == [FAKE_CALCULATOR_TOOL]
    assert sft[0]["completion"][0]["tool_calls"][0]["function"]["name"] == "calculator"

    on_store(store_path, lambda s: export_sft(s, tmp_path / "conv.parquet", fmt="trl", unit="rollout"))
    conv = datasets.load_dataset("parquet", data_files=str(tmp_path / "conv.parquet"), split="train")
    assert conv.column_names == ["messages", "tools"] and len(conv) == 48 and data_utils.is_conversational(conv[0])

    on_store(store_path, lambda s: export_dpo(s, tmp_path / "dpo.parquet", fmt="trl"))
    dpo = datasets.load_dataset("parquet", data_files=str(tmp_path / "dpo.parquet"), split="train")
    assert dpo.column_names == ["prompt", "chosen", "rejected"] and len(dpo) == 24
    assert data_utils.is_conversational(dpo[0]) and dpo[0]["chosen"] != dpo[0]["rejected"]

    on_store(store_path, lambda s: export_transitions(s, tmp_path / "t.parquet", fmt="parquet"))
    tr = datasets.load_dataset("parquet", data_files=str(tmp_path / "t.parquet"), split="train")
    assert len(tr) == 96 and {"input_ids", "completion_mask", "reward", "rollout_id"} <= set(tr.column_names)


def test_cli_exports_and_reports(store_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([FAKE_CALCULATOR_TOOL]))
    out = tmp_path / "sft.jsonl"
    argv = ["export", "sft", "--store", str(store_path), "--out", str(out), "--min-reward", "1", "--tools", str(tools)]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"wrote 48 records from 24 rollouts to {out}")
    assert all(r["tools"] == [FAKE_CALCULATOR_TOOL] for r in lines(out))

    assert main(["export", "dpo", "--store", str(store_path), "--out", str(tmp_path / "d.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "left out: pair rollout" in err and "more like these" in err

    assert main(["export", "transitions", "--store", str(store_path), "--out", str(tmp_path / "t.parquet")]) == 0
    assert "wrote 96 records" in capsys.readouterr().out

    assert main(["export", "sft", "--store", str(store_path)]) == 2
    assert "--out is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "sft", "--store", str(store_path), "--out", "x.jsonl", "--since", "yesterday"])
    assert "neither Unix seconds nor an ISO date" in capsys.readouterr().err


def test_a_parquet_export_without_pyarrow_names_the_extra(store_path: Path, tmp_path: Path) -> None:
    code = (
        "import sys\nsys.modules['pyarrow'] = None\nfrom lightning_rl.cli import main\n"
        f"raise SystemExit(main(['export', 'transitions', '--store', {str(store_path)!r}, "
        f"'--out', {str(tmp_path / 't.parquet')!r}]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("lightning-rl: error: ") and "pip install 'lightning-rl[export]'" in line
    assert not list(tmp_path.glob("t.parquet*"))


def test_a_jsonl_export_needs_no_training_stack(store_path: Path, tmp_path: Path) -> None:
    """JSONL exports and hosted SFT run where only the base install is (no torch, numpy, pyarrow, servers)."""
    heavy = ("torch", "transformers", "numpy", "pyarrow", "fastapi", "uvicorn")
    argv = ["export", "sft", "--store", str(store_path), "--out", str(tmp_path / "a.jsonl")]
    code = (
        "import sys\n"
        + "".join(f"sys.modules[{m!r}] = None\n" for m in heavy)
        + f"from lightning_rl.cli import main\nraise SystemExit(main({argv!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 96
