"""The learning guard: a change that stops the demo from learning cannot land.

Every other test checks that the pieces work; this one checks that together they still *learn*. It
runs the demo's reduced configuration (``DemoConfig.quick()``, what ``lightning-rl demo --quick``
runs: the full warm start, 6 smaller GRPO steps, 50 held-out tasks, greedy validation) with a fixed
seed and fails if the held-out gain falls below ``MIN_GAIN``.

Why that threshold: half the mean gain measured for this configuration over seeds 0-4 (+0.88 with one
torch thread at b7c259c, every seed between +0.80 and +0.94; see ``MEASURED`` and benchmarks/README.md,
"Learning"). Repeating the RL phase of seed 0 four times (one thread) gave +0.78 to +0.94
(``benchmarks/rl_phase.py``), and the default demo gained +0.86 to +0.98 with two threads. So ordinary
run-to-run and CPU-to-CPU variation does not trip it, while a broken update does: with the
advantage's sign flipped this test's run went 0.00 -> 0.00 and it failed. At the old GRPO learning
rate (1e-3) one RL run in four also went 0.00 -> 0.00, which is how this guard caught that rate in CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

MEASURED = "uv run python benchmarks/learning.py --seeds 0-4 --threads 1 --jobs 1 --out runs/learning-quick -- --quick"
"""The command whose output set ``MIN_GAIN``."""
MIN_GAIN = 0.44
"""Held-out gain below which learning counts as broken (see the module docstring)."""


@pytest.mark.slow
def test_the_demo_still_learns(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from lightning_rl.demo.run import DemoConfig, run_demo

    result = run_demo(DemoConfig.quick(seed=0, run_dir=str(tmp_path / "guard"), progress=False))
    assert result.val_base is not None and result.val_trained is not None
    gain = result.val_trained - result.val_base
    assert gain >= MIN_GAIN, (
        f"held-out reward went {result.val_base:.2f} -> {result.val_trained:.2f} (gain {gain:+.2f} < {MIN_GAIN}): "
        f"the demo no longer learns. Look at {tmp_path / 'guard' / 'metrics.jsonl'} (tool_call_rate, entropy, "
        "kl_to_start per step) and at what your change did to rewards, advantages or the update."
    )
