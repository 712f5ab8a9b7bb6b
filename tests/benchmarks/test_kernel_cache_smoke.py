"""``benchmarks/kernel_cache.py`` end to end, with few calls (its real run feeds 600 inputs per variant)."""

from __future__ import annotations

import re

import pytest

from .conftest import load_benchmark


def test_kernel_cache_prints_a_row_per_dtype_and_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    bench = load_benchmark("kernel_cache")
    bench.main(["--capacities", "default,8", "--dtype", "bfloat16,float32", "--calls", "20", "--max-rows", "64"])
    out = capsys.readouterr().out
    assert out.startswith("Generated ") and "fed 20 inputs of 1-64 random rows" in out
    rows = re.findall(
        r"^\| (\w+) \| ([\w,() ]+) \| [\d.]+ GB \| [\d.]+ GB \| \*\*\+?(-?[\d.]+) GB\*\* \| [\d.]+ \|$", out, re.M
    )
    assert [(dtype, cap) for dtype, cap, _ in rows] == [
        ("bfloat16", "1,024 (default)"),
        ("bfloat16", "8"),
        ("float32", "1,024 (default)"),
        ("float32", "8"),
    ]
