"""Fixtures for the training tests: the tiny model (built once, cached) and a fresh policy from it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from lightning_rl.engine.tiny import default_tiny_model

    return default_tiny_model()
