"""Per-step learning diagnostics: policy entropy and KL to the start from the torch backend, tool-use
rates and response lengths from the rollouts, and how they reach the step line.

Entropy is checked against a hand computation on a model whose logits are a fixed table (so the
sampling distribution at every position is known); KL uses the real tiny model.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_rl import semconv
from lightning_rl.backends.losses import token_entropy
from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
from lightning_rl.credit import rollout_advantages
from lightning_rl.engine.logprobs import sampling_logprobs
from lightning_rl.store.memory import MemoryStore
from lightning_rl.trainer.loop import collect_samples
from lightning_rl.trainer.metrics import has_tool_call, tool_call_metrics, zero_advantage_frac
from lightning_rl.trainer.progress import step_line
from lightning_rl.types import AttemptStatus, RolloutRequest, Span, Task, Transition

# --- entropy ------------------------------------------------------------------------------------


def _hand_entropy(logits: list[float], temperature: float, top_p: float) -> float:
    """Entropy of the sampling distribution, from the definition in engine/logprobs.py, in plain Python."""
    z = [x / temperature for x in logits]
    top = max(z)
    total = sum(math.exp(v - top) for v in z)
    p = [math.exp(v - top) / total for v in z]
    kept: list[int] = []
    mass = 0.0
    for i in sorted(range(len(p)), key=lambda i: -p[i]):
        if not kept or mass < top_p:
            kept.append(i)
        mass += p[i]
    norm = sum(p[i] for i in kept)
    return -sum(p[i] / norm * math.log(p[i] / norm) for i in kept)


TABLE = [
    [2.0, 0.5, -1.0, 0.0, 1.0],
    [0.0, 0.0, 0.0, 0.0, 0.0],
    [3.0, -2.0, 1.0, 0.5, -0.5],
    [0.1, 0.2, 0.3, 0.4, 5.0],
    [-1.0, 1.5, 1.5, -0.2, 0.7],
]


class FixedLogits(torch.nn.Module):
    """A 'language model' whose logits after token ``t`` are ``TABLE[t]``, whatever came before."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(TABLE))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        return SimpleNamespace(logits=self.table[input_ids])


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (1.3, 0.75)])
def test_token_entropy_matches_the_definition(temperature: float, top_p: float) -> None:
    got = token_entropy(sampling_logprobs(torch.tensor(TABLE), temperature, top_p))
    for row, value in zip(TABLE, got.tolist(), strict=True):
        assert value == pytest.approx(_hand_entropy(row, temperature, top_p), abs=1e-5)
    # the uniform row at temperature 1, no nucleus: log(5)
    if (temperature, top_p) == (1.0, 1.0):
        assert got[1].item() == pytest.approx(math.log(5), abs=1e-6)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (1.3, 0.75)])
def test_update_reports_the_mean_entropy_per_response_token(temperature: float, top_p: float) -> None:
    batch = [
        Transition(prompt_ids=[0, 1], response_ids=[2, 3, 4], rollout_id="r0", attempt_id="a", advantage=1.0),
        Transition(prompt_ids=[4], response_ids=[0], rollout_id="r1", attempt_id="a", advantage=-1.0),
        Transition(prompt_ids=[3, 3, 1], response_ids=[1, 1], rollout_id="r2", attempt_id="a", advantage=0.5),
    ]
    # response token k is predicted after the token before it: prompt[-1] for the first, then the response
    predicted_after = [t for b in batch for t in [b.prompt_ids[-1], *b.response_ids[:-1]]]
    expected = sum(_hand_entropy(TABLE[t], temperature, top_p) for t in predicted_after) / len(predicted_after)
    # lr 0 keeps the table fixed across mini-batches and epochs, so every token sees the same logits
    cfg = TorchBackendConfig(
        old_logprobs="recompute", lr=0.0, temperature=temperature, top_p=top_p, mini_batches=2, ppo_epochs=2
    )
    metrics = TorchBackend(FixedLogits(), cfg).update(batch)
    assert metrics["train/entropy"] == pytest.approx(expected, abs=1e-5)
    assert metrics["train/kl_to_start"] == pytest.approx(0.0, abs=1e-6)


# --- KL to the starting policy ------------------------------------------------------------------


def _policy(path: Path, **cfg: Any) -> TorchBackend:
    return TorchBackend(AutoModelForCausalLM.from_pretrained(path), TorchBackendConfig(**cfg))


def _batch(n: int = 6) -> list[Transition]:
    gen = torch.Generator().manual_seed(0)
    return [
        Transition(
            prompt_ids=torch.randint(10, 500, (5 + 3 * i,), generator=gen).tolist(),
            response_ids=torch.randint(10, 500, (2 + i,), generator=gen).tolist(),
            rollout_id=f"r{i % 3}",
            attempt_id="a",
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(n)
    ]


def test_kl_to_start_is_zero_before_any_update_and_positive_after_one(tiny_model_path: Path) -> None:
    policy = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-2)
    first = policy.update(_batch())
    second = policy.update(_batch())
    assert first["train/kl_to_start"] == pytest.approx(0.0, abs=1e-6)
    assert second["train/kl_to_start"] > 1e-4
    assert first["train/entropy"] > 0.0 and math.isfinite(second["train/entropy"])
    assert "train/kl" in first and first["train/kl"] == 0.0  # the diagnostic is not a penalty


def test_kl_to_start_reuses_the_kl_reference_and_can_be_turned_off(tiny_model_path: Path) -> None:
    penalised = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-2, kl_coef=0.1)
    penalised.update(_batch())
    metrics = penalised.update(_batch())
    assert metrics["train/kl_to_start"] > 1e-4 and penalised._start is None  # pyright: ignore[reportPrivateUsage]

    off = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-2, track_kl=False)
    metrics = off.update(_batch())
    assert "train/kl_to_start" not in metrics and "train/entropy" in metrics
    assert off._start is None and off.reference is None  # pyright: ignore[reportPrivateUsage]


def test_sft_alone_copies_nothing(tiny_model_path: Path) -> None:
    policy = _policy(tiny_model_path, lr=1e-3)
    policy.sft([([1, 2, 3], [4, 5])], steps=2, batch_size=1)
    assert policy._start is None  # pyright: ignore[reportPrivateUsage]


def test_a_resumed_run_measures_kl_from_the_original_start(tiny_model_path: Path, tmp_path: Path) -> None:
    a = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-2)
    a.update(_batch())
    a.update(_batch())
    a.save_checkpoint(tmp_path)
    expected = a.update(_batch())["train/kl_to_start"]
    # a fresh backend from the same starting weights measures KL from those, not from the checkpoint
    b = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-2)
    b.load_checkpoint(tmp_path)
    got = b.update(_batch())["train/kl_to_start"]
    assert expected > 1e-4
    assert got == pytest.approx(expected, rel=1e-4)


def test_kl_to_start_under_lora_uses_the_base_model(tiny_model_path: Path) -> None:
    pytest.importorskip("peft")
    policy = _policy(tiny_model_path, old_logprobs="recompute", lr=5e-2, lora_rank=4)
    first = policy.update(_batch())
    second = policy.update(_batch())
    assert policy._start is None  # pyright: ignore[reportPrivateUsage]
    assert first["train/kl_to_start"] == pytest.approx(0.0, abs=1e-6)
    assert second["train/kl_to_start"] > 1e-5


def test_kl_every_measures_the_kl_on_every_nth_update_from_the_first_updates_start(tiny_model_path: Path) -> None:
    every = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-2, kl_every=2)
    always = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-2)
    got: list[tuple[float | None, float]] = []
    for _ in range(4):
        measured, reference = every.update(_batch()), always.update(_batch())
        got.append((measured.get("train/kl_to_start"), reference["train/kl_to_start"]))
    assert [m is not None for m, _ in got] == [False, True, False, True]
    # the start is the policy of the first update, measured or not: the same KL as measuring every time
    assert got[3][0] == pytest.approx(got[3][1], rel=1e-4) and got[3][1] > 1e-4
    with pytest.raises(ValueError, match="kl_every must be >= 1"):
        TorchBackendConfig(kl_every=0)


def test_kl_rows_measures_the_kl_on_a_subset_of_the_batch_with_a_pass_over_those_rows_only(
    tiny_model_path: Path,
) -> None:
    batch = _batch()
    start = _policy(tiny_model_path).logprobs(batch)
    sampled = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-2, kl_rows=2)
    passes: list[int] = []
    measure = sampled._logprobs_of  # pyright: ignore[reportPrivateUsage]

    def counted(model: torch.nn.Module, transitions: Any) -> list[list[float]]:
        passes.append(len(transitions))
        return measure(model, transitions)

    sampled._logprobs_of = counted  # pyright: ignore[reportPrivateUsage]
    sampled.update(batch)
    before = sampled.logprobs(batch)  # the policy the second update's forward pass runs
    passes.clear()
    got = sampled.update(batch)["train/kl_to_start"]
    assert passes == [2]  # the start's no-grad pass ran on the two measured rows only

    def k3(row: int) -> list[float]:
        return [math.exp(s - p) - (s - p) - 1 for s, p in zip(start[row], before[row], strict=True)]

    def mean(rows: tuple[int, ...]) -> float:
        values = [v for r in rows for v in k3(r)]
        return sum(values) / len(values)

    # the reported figure is the token mean over some two rows, not over all six
    pairs = [(i, j) for i in range(6) for j in range(i + 1, 6)]
    assert any(mean(pair) == pytest.approx(got, rel=1e-3) for pair in pairs)
    assert mean(tuple(range(6))) != pytest.approx(got, rel=1e-3)
    whole = _policy(tiny_model_path, old_logprobs="recompute", lr=1e-2, kl_rows=6)
    whole.update(batch)
    assert whole.update(batch)["train/kl_to_start"] == pytest.approx(mean(tuple(range(6))), rel=1e-3)
    with pytest.raises(ValueError, match="kl_rows must be >= 0"):
        TorchBackendConfig(kl_rows=-1)


# --- sft: progress callback and one batch stream per backend ------------------------------------


def test_sft_calls_on_step_once_per_step_with_loss_and_lr(tiny_model_path: Path) -> None:
    policy = _policy(tiny_model_path, lr=1e-3)
    seen: list[tuple[int, float, float]] = []
    examples = [([1, 2, 3 + i], [4 + i, 5]) for i in range(8)]

    def on_step(step: int, loss: float, lr: float) -> None:
        seen.append((step, loss, lr))

    losses = policy.sft(examples, steps=5, batch_size=2, warmup_steps=2, final_lr_fraction=0.0, on_step=on_step)
    assert [s for s, _, _ in seen] == list(range(5))
    assert [loss for _, loss, _ in seen] == losses
    assert [lr for _, _, lr in seen] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3 * 0.75, 1e-3 * 0.25])


def _record_batches(policy: TorchBackend, batches: list[list[int]]) -> None:
    """Record which examples each sft step draws (the example's index is its response's first token)."""
    original = policy.optimizer.zero_grad

    def spy(set_to_none: bool = True) -> None:
        batches.append([])
        original(set_to_none=set_to_none)

    policy.optimizer.zero_grad = spy  # type: ignore[method-assign]
    real = policy._response_logprobs  # pyright: ignore[reportPrivateUsage]

    def logprobs(model: torch.nn.Module, mb: Any) -> torch.Tensor:
        for row, p in enumerate(mb.prompt_lens):
            batches[-1].append(int(mb.input_ids[row, p]))
        return real(model, mb)

    policy._response_logprobs = logprobs  # type: ignore[method-assign]


def test_consecutive_sft_calls_continue_the_batch_stream(tiny_model_path: Path, tmp_path: Path) -> None:
    examples = [([1, 2, 3], [10 + i, 5]) for i in range(50)]
    one_call, two_calls, resumed = (_policy(tiny_model_path, lr=1e-3) for _ in range(3))
    a: list[list[int]] = []
    b: list[list[int]] = []
    c: list[list[int]] = []
    _record_batches(one_call, a)
    _record_batches(two_calls, b)
    one_call.sft(examples, steps=6, batch_size=4)
    two_calls.sft(examples, steps=3, batch_size=4)
    two_calls.save_checkpoint(tmp_path)
    two_calls.sft(examples, steps=3, batch_size=4)
    assert sorted(map(sorted, b[:3])) != sorted(map(sorted, b[3:]))  # the second call draws new batches
    assert list(map(sorted, a)) == list(map(sorted, b))  # ... the very ones one longer call would draw
    # the sampler's position survives a checkpoint
    resumed.load_checkpoint(tmp_path)
    _record_batches(resumed, c)
    resumed.sft(examples, steps=3, batch_size=4)
    assert list(map(sorted, c)) == list(map(sorted, b[3:]))


# --- rollout-level rates -------------------------------------------------------------------------


def _llm_span(rollout_id: str, attempt_id: str, tool_calls: Any, response: list[int]) -> Span:
    attrs: dict[str, Any] = {
        semconv.PROMPT_TOKEN_IDS: [1, 2, 3],
        semconv.RESPONSE_TOKEN_IDS: response,
        semconv.RESPONSE_LOGPROBS: [-0.5] * len(response),
    }
    if tool_calls is not None:
        attrs[semconv.TOOL_CALLS] = tool_calls
    return Span(name=semconv.SPAN_LLM_CALL, rollout_id=rollout_id, attempt_id=attempt_id, attributes=attrs)


CALL = '[{"id": "call_1", "name": "calculator", "arguments": "{}"}]'

# rollout -> (reward or None for a failed one, the tool_calls attribute of each llm.call span)
ROLLOUTS: dict[str, tuple[float | None, list[Any]]] = {
    "uses-tool-first-call": (1.0, [CALL, "[]"]),
    "uses-tool-later-call": (0.5, ["[]", "[]", CALL]),
    "tool-calls-as-a-list": (1.0, [[{"id": "x", "name": "calculator", "arguments": "{}"}]]),
    "answers-directly": (0.0, ["[]"]),
    "no-attribute": (0.25, [None]),
    "failed-with-tool": (None, [CALL]),
}


async def test_tool_call_rate_and_reward_split_on_constructed_rollouts() -> None:
    store = MemoryStore()
    await store.enqueue([RolloutRequest(id=r, task=Task(input={}), group_id="g") for r in ROLLOUTS])
    for _ in ROLLOUTS:
        (claim,) = await store.claim("w")
        reward, calls = ROLLOUTS[claim.rollout.id]
        # response lengths 1, 2, 3, ... across each rollout's calls
        spans = [_llm_span(claim.rollout.id, claim.attempt.id, c, [7] * (k + 1)) for k, c in enumerate(calls)]
        await store.add_spans(spans)
        if reward is None:
            await store.finish_attempt(claim.attempt.id, AttemptStatus.FAILED, error="boom")
        else:
            await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=reward)
    rollouts = [await store.get_rollout(r) for r in ROLLOUTS]
    collected = await collect_samples(store, rollouts, trainable=None, air={})
    assert collected.failed == 1 and len(collected.rewards) == 5
    metrics = collected.rollout_metrics("train")
    assert metrics["train/tool_call_rate"] == pytest.approx(3 / 5)
    assert metrics["train/reward_with_tool"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert metrics["train/reward_without_tool"] == pytest.approx((0.0 + 0.25) / 2)
    # 8 calls of the scored rollouts: lengths (1, 2), (1, 2, 3), (1,), (1,), (1,)
    assert metrics["train/response_tokens_mean"] == pytest.approx(12 / 8)


def test_tool_metrics_are_nan_where_undefined() -> None:
    every = tool_call_metrics("val", [1.0, 0.0], [True, True])
    assert every["val/tool_call_rate"] == 1.0 and every["val/reward_with_tool"] == 0.5
    assert math.isnan(every["val/reward_without_tool"])
    empty = tool_call_metrics("train", [], [])
    assert all(math.isnan(v) for v in empty.values())
    with pytest.raises(ValueError, match="tool flags"):
        tool_call_metrics("train", [1.0], [])


def test_only_parsed_tool_calls_on_llm_calls_count() -> None:
    def span(name: str, attrs: dict[str, Any]) -> Span:
        return Span(name=name, rollout_id="r", attempt_id="a", attributes=attrs)

    assert not has_tool_call([span(semconv.SPAN_TOOL, {semconv.TOOL_CALLS: CALL})])  # a tool span, not a call
    assert not has_tool_call([span(semconv.SPAN_LLM_CALL, {semconv.TOOL_CALLS: "not json"})])
    unparsed = {semconv.TOOL_CALLS: "[]", semconv.TOOL_CALL_PARSE_ERROR: "bad arguments"}
    assert not has_tool_call([span(semconv.SPAN_LLM_CALL, unparsed)])
    assert has_tool_call([span(semconv.SPAN_LLM_CALL, {}), span(semconv.SPAN_LLM_CALL, {semconv.TOOL_CALLS: CALL})])


def test_zero_advantage_fraction_ignores_rounding_noise() -> None:
    # a GRPO group of eight equal 0.9 rewards: the mean is off by one ulp, the advantages are ~1e-10
    noisy = rollout_advantages([0.9] * 8, ["g"] * 8)
    assert all(0.0 < abs(a) < 1e-9 for a in noisy)
    assert zero_advantage_frac([*noisy, 0.0, 1.2, -0.7, 0.0]) == pytest.approx(10 / 12)
    assert math.isnan(zero_advantage_frac([]))


# --- on screen ----------------------------------------------------------------------------------


def test_step_line_shows_tool_rate_entropy_and_kl_when_present() -> None:
    row = {
        "step": 3.0,
        "train/reward_mean": 0.5,
        "train/n_updated_transitions": 8.0,
        "train/n_transitions": 10.0,
        "train/loss": 0.01,
        "train/step_s": 2.0,
        "train/tool_call_rate": 0.9375,
        "train/entropy": 0.41,
        "train/kl_to_start": 0.01234,
    }
    assert step_line(row).endswith("loss +0.0100  tool 0.94  ent 0.41  kl 0.0123  2.0s")
    no_update = {**row, "train/tool_call_rate": float("nan")}
    del no_update["train/entropy"], no_update["train/kl_to_start"]
    assert step_line(no_update).endswith("loss +0.0100  2.0s")
