"""``TorchBackendConfig.autocast``: the body in bfloat16, the head and the softmax in float32.

The engine samples in float32; a bfloat16 policy's logprobs differ from those by rounding. How much
is measured here on the tiny model (and bounds the tolerance below), because it decides whether the
PPO ratio may be taken against the engine's sampled logprobs or must be recomputed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig, fast_bfloat16
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.types import Transition

from .conftest import sampled_transitions

BF16_GAP = 0.02
"""Largest |bfloat16 recomputed - float32 sampled| logprob allowed. Measured on the tiny model (the 96
tokens sampled below, an AVX2 EPYC, 1 and 2 torch threads alike): max 3.6e-3, mean 1.1e-3. 0.02 is
~5x that max; a wrong position or weight version moves logprobs by 1e-2 to whole nats. A deeper model
rounds more (30 layers for SmolLM2-135M against the tiny model's few), so this bounds the tiny model
only."""


def _sampled(model_path: Path) -> list[Transition]:
    with TransformersEngine.from_pretrained(model_path, max_batch_size=8) as engine:
        return sampled_transitions(engine)


def test_bfloat16_autocast_logprobs_stay_within_rounding_of_the_float32_engine(tiny_model_path: Path) -> None:
    transitions = _sampled(tiny_model_path)
    gaps: dict[str | None, torch.Tensor] = {}
    for autocast in (None, "bfloat16"):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
        backend = TorchBackend(model, TorchBackendConfig(autocast=autocast))
        recomputed = backend.logprobs(transitions)
        gaps[autocast] = torch.cat(
            [
                torch.tensor(r) - torch.tensor(t.response_logprobs or [])
                for r, t in zip(recomputed, transitions, strict=True)
            ]
        ).abs()
    assert float(gaps[None].max()) < 1e-4  # float32 against float32: rounding only
    assert 0 < float(gaps["bfloat16"].max()) < BF16_GAP  # bfloat16 really ran, and stayed close
    assert float(gaps["bfloat16"].mean()) < BF16_GAP / 5


def test_an_update_under_autocast_keeps_float32_weights_and_moves_the_logprobs(tiny_model_path: Path) -> None:
    transitions = _sampled(tiny_model_path)[:4]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    backend = TorchBackend(model, TorchBackendConfig(autocast="bfloat16", old_logprobs="recompute", lr=1e-2))
    scored = [t.model_copy(update={"advantage": 1.0 if i % 2 else -1.0}) for i, t in enumerate(transitions)]
    before = backend.logprobs(scored)
    backend.update(scored)
    after = backend.logprobs(scored)
    assert all(p.dtype == torch.float32 for p in backend.model.parameters())
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        assert (sum(a) > sum(b)) == (i % 2 == 1), (b, a)


def test_auto_picks_bfloat16_only_where_it_is_fast() -> None:
    assert TorchBackendConfig(autocast="auto").autocast == ("bfloat16" if fast_bfloat16("cpu") else None)
    assert TorchBackendConfig(autocast="auto", device="cuda").autocast == "bfloat16"
    with pytest.raises(ValueError, match="autocast"):
        TorchBackendConfig(autocast="int8")


def test_auto_precision_takes_bfloat16_only_where_this_cpu_measures_it_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU flags do not promise speed: an AVX-512 Xeon with AVX512_BF16 (no AMX) ran bfloat16 matmuls
    at 0.5-0.9x float32's rate, so ``auto`` times them where the flags allow bfloat16 at all."""
    import lightning_rl.backends.torch_backend as tb

    seconds = {torch.float32: 1.0, torch.bfloat16: 1.0}
    timed: list[torch.dtype] = []
    monkeypatch.setattr(tb, "_matmul_seconds", lambda dtype: timed.append(dtype) or seconds[dtype])

    def decide(flags: set[str] | None, bf16_seconds: float) -> bool:
        monkeypatch.setattr(tb, "cpu_flags", lambda: flags)
        seconds[torch.bfloat16] = bf16_seconds
        tb.fast_bfloat16.cache_clear()
        try:
            return tb.fast_bfloat16("cpu")
        finally:
            tb.fast_bfloat16.cache_clear()

    assert not decide({"avx2"}, 0.1) and not timed  # no bfloat16 instructions: emulated, not even timed
    assert not decide({"avx512_bf16"}, 1.6)  # the flag, but slower than float32 (the Xeon above)
    assert not decide({"avx512_bf16"}, 0.9)  # within the margin: float32 stays
    assert decide({"avx512_bf16"}, 0.2)  # 5x faster (the AMD EPYC's ratio)
    assert decide({"amx_bf16"}, 0.25)
    assert decide(None, 0.5) and not decide(None, 2.0)  # no /proc/cpuinfo: the timing alone decides
    assert tb.fast_bfloat16("cuda:0")
