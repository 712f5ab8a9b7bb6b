"""Stores for the export tests: real SQLite stores filled with fake calculator rollouts (``lightning_rl.testing``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

import pytest

from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.testing.synthetic_store import fill_fake_rollouts


def make_store(path: Path, *, tasks: int, group_size: int = 4, mode: Literal["train", "val", "test"] = "train") -> Path:
    """A SQLite store at ``path`` holding ``tasks * group_size`` fake rollouts (half reward 1, half 0)."""

    async def fill() -> None:
        store = SQLiteStore(path)
        try:
            await fill_fake_rollouts(store, tasks=tasks, group_size=group_size, mode=mode)
        finally:
            await store.close()

    asyncio.run(fill())
    return path


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """12 tasks x 4 rollouts: 24 with reward 1 (2 calls each), 24 with reward 0."""
    return make_store(tmp_path / "store.sqlite", tasks=12)
