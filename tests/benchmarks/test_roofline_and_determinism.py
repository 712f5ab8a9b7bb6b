"""The arithmetic behind ``roofline.py`` and ``determinism.py`` (their runs take minutes on SmolLM2 or
the demo; what they compute from those runs is checked here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from determinism import compare  # noqa: E402
from roofline import ModelShape, profile_breakdown  # noqa: E402


def test_the_flop_count_is_two_per_weight_of_every_linear_layer_plus_attention() -> None:
    transformers = pytest.importorskip("transformers")
    from lightning_rl.engine.tiny import default_tiny_model

    model = transformers.AutoModelForCausalLM.from_pretrained(default_tiny_model())
    shape = ModelShape.of(model.config)
    layers = model.model.layers
    weights = sum(m.weight.numel() for m in layers.modules() if m.__class__.__name__ == "Linear")
    assert shape.body_flops(0) == 2 * weights  # no context: the linear layers alone
    extra = shape.body_flops(10) - shape.body_flops(0)
    assert extra == shape.layers * 2 * 2 * 10 * shape.hidden  # QK^T and AV over 10 positions
    assert shape.head_flops == 2 * model.get_output_embeddings().weight.numel()


def test_compare_finds_the_first_differing_step_and_the_reward_gaps() -> None:
    a: list[dict[str, float]] = [
        {"step": 0, "val/reward_mean": 0.1},
        {"step": 1, "train/reward_mean": 0.5},
        {"step": 2, "train/reward_mean": 0.7},
    ]
    assert compare(a, [dict(r) for r in a]) == (True, None, 0.0, 0.0)
    b = [dict(r) for r in a]
    b[2]["train/reward_mean"] = 0.6
    identical, first, train, held_out = compare(a, b)
    assert not identical and first == 2 and train == pytest.approx(0.1) and held_out == 0.0
    assert compare(a, a[:2])[:2] == (False, 1)  # one run logged fewer rows


def test_the_profile_puts_matmuls_attention_and_the_rest_in_their_own_kinds() -> None:
    torch = pytest.importorskip("torch")
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    q = torch.randn(1, 2, 16, 8)
    vocab = torch.randn(512, 4096)

    def call() -> None:
        for _ in range(4):
            _ = a @ b
        # an elementwise op that is its own leaf and large enough to outrank the profiler's bookkeeping
        # operators on any CPU: relu was not (its work is a child, aten::clamp_min, so relu's self time is
        # near zero and fell out of the top four on an AMX Xeon)
        torch.exp(vocab)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        torch.log_softmax(vocab, dim=-1)  # the output head's, over the vocabulary: not attention

    found = profile_breakdown("probe", call)
    assert found.matmul_ms > 0 and found.attention_ms > 0 and found.other_ms > 0
    assert found.matmul_ms + found.attention_ms + found.other_ms <= found.wall_ms
    assert found.matmul_gflops > 0  # the profiler counts 2*m*k*n per mm
    names = [name for name, _ in found.top_other]
    assert any(name == "aten::exp" for name in names) and any("log_softmax" in name for name in names)
