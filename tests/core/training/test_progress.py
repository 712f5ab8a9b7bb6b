"""The terminal progress view: step lines above a bar that counts steps; silent when disabled."""

from __future__ import annotations

import io

from rich.console import Console

from lightning_rl.trainer.progress import StepProgress

ROW = {
    "step": 1.0,
    "train/reward_mean": 0.25,
    "train/n_updated_transitions": 3.0,
    "train/n_transitions": 4.0,
    "train/failed_rollouts": 1.0,
    "train/timed_out_rollouts": 1.0,
    "train/loss": -0.5,
    "train/step_s": 1.5,
}


def test_the_bar_counts_steps_and_prints_each_step_line() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=120)
    with StepProgress(3, console=console) as bar:
        bar.note("held-out reward 0.100")
        bar.step_done(ROW)
        bar.step_done({**ROW, "step": 2.0, "train/reward_mean": 0.5})
    text = out.getvalue()
    assert "held-out reward 0.100" in text
    assert "step   1  reward 0.250  transitions 3/4  failed 2  loss -0.5000  1.5s" in text
    assert "2/3" in text and "reward 0.500" in text


def test_disabled_progress_prints_nothing() -> None:
    out = io.StringIO()
    with StepProgress(2, enabled=False, console=Console(file=out)) as bar:
        bar.note("hidden")
        bar.step_done(ROW)
    assert out.getvalue() == ""
