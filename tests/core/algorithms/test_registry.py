"""The algorithm registry and the update-rule seam: names resolve lazily, unknown names say what exists."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lightning_rl.algorithms import algorithm_names, get_algorithm, register_algorithm


def test_builtin_algorithms_are_registered() -> None:
    assert {"grpo", "rloo", "ppo", "sft", "dpo", "apo"} <= set(algorithm_names())
    assert get_algorithm("rloo").options == {"estimator": "rloo"}


def test_unknown_algorithm_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: grpo, rloo"):
        get_algorithm("reinforce++")


def test_listing_algorithms_imports_no_torch() -> None:
    code = "import sys, lightning_rl.algorithms as a; a.algorithm_names(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_rl_and_sft_entries_load_their_classes_and_config_classes() -> None:
    pytest.importorskip("torch")
    from lightning_rl.algorithms.sft import SFT, SFTConfig
    from lightning_rl.trainer import Trainer, TrainerConfig

    assert get_algorithm("grpo").load() is Trainer
    assert get_algorithm("grpo").config_class() is TrainerConfig
    assert get_algorithm("sft").load() is SFT
    assert get_algorithm("sft").config_class() is SFTConfig


def test_a_missing_module_is_an_import_error_naming_it() -> None:
    entry = register_algorithm("not-installed", "lightning_rl_nowhere.algo:Algo", "test entry", replace=True)
    with pytest.raises(ImportError, match="lightning_rl_nowhere.algo is missing"):
        entry.load()


def test_registering_a_taken_name_needs_replace() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm("grpo", "x:y", "again")


def test_unknown_update_rule_is_rejected_by_the_config() -> None:
    pytest.importorskip("torch")
    from lightning_rl.trainer import TrainerConfig

    with pytest.raises(ValueError, match="update_rule 'reinforce' is unknown; known: policy_gradient, sft"):
        TrainerConfig(update_rule="reinforce")
