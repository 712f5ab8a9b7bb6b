"""``lightning-rl inspect`` on a real training run's store: the terminal shows what the page shows."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
from pathlib import Path

import pytest
from rich.console import Console

from lightning_rl.cli import main
from lightning_rl.dashboard._inspect import run_inspect
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.types import AttemptStatus, RolloutRequest, RolloutStatus, Task


def _ids(run: Path) -> list[str]:
    async def go() -> list[str]:
        store = SQLiteStore(run / "store.sqlite")
        try:
            return [r.id for r in await store.query_rollouts(mode="train", status=[RolloutStatus.SUCCEEDED], limit=100)]
        finally:
            await store.close()

    return asyncio.run(go())


def test_rollouts_rollout_and_transitions(
    trained_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich would squeeze the table to 80 columns when captured
    store = str(trained_run / "store.sqlite")
    assert main(["inspect", "rollouts", "--store", store, "--mode", "val", "--limit", "100"]) == 0
    out = capsys.readouterr().out
    assert "val" in out and "train" not in out.split("\n", 3)[-1]
    assert main(["inspect", "rollouts", "--store", store, "--role", "critic", "--limit", "1"]) == 0
    assert "critic" in capsys.readouterr().out

    rollout_id = _ids(trained_run)[0]
    assert main(["inspect", "rollout", "--store", store, rollout_id]) == 0
    out = capsys.readouterr().out
    assert "lightning.rollout" in out and out.count("llm.call") == 2 and "role=writer" in out
    assert "AIR reward" in out and "tool_error" in out

    assert main(["inspect", "transitions", "--store", store, rollout_id]) == 0
    out = capsys.readouterr().out
    assert "writer" in out and "critic" in out and "group s1-" in out


def test_an_unknown_rollout_says_how_to_find_one(trained_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "rollout", "--store", str(trained_run / "store.sqlite"), "nope"]) == 1
    assert "inspect rollouts" in capsys.readouterr().out


async def test_tail_prints_rollouts_as_they_finish(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    store = SQLiteStore(path)
    buf = io.StringIO()
    console = Console(file=buf, width=200)
    args = argparse.Namespace(
        inspect_command="tail", store=str(path), run=None, store_token=None, interval=0.05, last=5
    )
    try:
        await store.enqueue([RolloutRequest(id="early", task=Task(input=1))])
        (claim,) = await store.claim("w")
        await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=0.25)
        task = asyncio.create_task(run_inspect(args, console))
        await asyncio.sleep(0.5)
        await store.enqueue([RolloutRequest(id="late", task=Task(input=2))])
        (claim,) = await store.claim("w")
        await store.finish_attempt(claim.attempt.id, AttemptStatus.FAILED, error="agent bug")
        for _ in range(100):
            if "late" in buf.getvalue():
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await store.close()
    out = buf.getvalue()
    assert "early" in out and "0.250" in out  # the backlog table
    assert "late failed" in out and "agent bug" in out  # the followed line
