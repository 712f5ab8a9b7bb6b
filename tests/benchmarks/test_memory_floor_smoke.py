"""``benchmarks/memory_floor.py`` end to end on the tiny model (its real runs train SmolLM2)."""

from __future__ import annotations

import re

import pytest

from .conftest import load_benchmark


def test_memory_floor_prints_the_floor_after_every_step(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    from lightning_rl.engine.models import resolve_model

    bench = load_benchmark("memory_floor")
    tiny = str(resolve_model("tiny"))  # an untrained start is enough to measure memory
    bench.main([tiny, "--tiny", "--steps", "2", "--threads", "1", "--precision", "float32"])
    out = capsys.readouterr().out
    assert out.startswith("Generated ") and "precision float32" in out
    floors = re.findall(r"^\| (\d) \| \*\*([\d.]+) GB\*\* \| ([\d.]+) GB \| ([\d.]+) GB \| \d+ s \|$", out, re.M)
    assert [int(step) for step, *_ in floors] == [1, 2]
    assert all(float(floor) > 0 and float(update) > 0 for _, floor, _, update in floors)
    assert "floor change per step: " in out
