"""The shared warm start: chat demonstrations rendered with the engine's template, SFT, an HF folder out."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from lightning_rl.trainer.warm_start import sft_on_chats

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]


def test_sft_on_chats_lowers_the_loss_and_saves_a_loadable_model(tmp_path: Path, tiny_model_path: Path) -> None:
    demos = [
        ([{"role": "user", "content": f"say {w}"}], None, f"{w} {w}") for w in ("red", "blue", "green", "gold")
    ] + [([{"role": "user", "content": "add them"}], TOOLS, "I will add.")]
    done = sft_on_chats(tiny_model_path, tmp_path / "ws", demos, steps=30, seed=0, batch_size=4)
    assert done.n_examples == 5 and len(done.losses) == 30
    assert sum(done.losses[-5:]) < sum(done.losses[:5])
    assert AutoModelForCausalLM.from_pretrained(done.model_dir) is not None


def test_no_demonstrations_is_a_clear_error(tmp_path: Path, tiny_model_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one example"):
        sft_on_chats(tiny_model_path, tmp_path / "ws", [], steps=1)
