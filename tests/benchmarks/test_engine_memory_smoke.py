"""``benchmarks/engine_memory.py`` end to end on the tiny model (its real runs load SmolLM2)."""

from __future__ import annotations

import re

import pytest

from .conftest import load_benchmark


def test_engine_memory_prints_a_row_per_engine_size(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    bench = load_benchmark("engine_memory")
    bench.main(["--model", "tiny", "--prompts", "6", "--rows", "6,3", "--max-tokens", "4", "--threads", "1"])
    out = capsys.readouterr().out
    assert out.startswith("Generated ") and "6 prompts of " in out
    rows = re.findall(
        r"^\| (\d+) \| (\d+) \| [\d.]+ \| (\d+) \| [\d.]+ GB \| [\d.]+ GB \| \*\*\+(-?[\d.]+) GB\*\* \|$", out, re.M
    )
    assert [r[0] for r in rows] == ["6", "3"]
    assert all(6 <= int(generated) <= 24 for _, generated, _, _ in rows)  # 1-4 tokens for each of 6 prompts
    assert all(float(above) >= 0 for *_, above in rows)  # a peak is never below where it started
