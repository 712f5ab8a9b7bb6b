"""Fixtures for the engine tests: one tiny model folder and one engine per session (both take seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lightning_rl.engine.tiny import build_tiny_model

pytest.importorskip("torch")
pytest.importorskip("transformers")

from lightning_rl.engine.hf import TransformersEngine  # noqa: E402


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen2")


@pytest.fixture(scope="session")
def engine(tiny_path: Path) -> Iterator[TransformersEngine]:
    """A shared engine. Tests that swap weights or need a small batch build their own."""
    with TransformersEngine.from_pretrained(tiny_path, max_batch_size=16) as shared:
        yield shared
