"""The per-role view (``train/role/<role>/...``): which role called, what trained, its AIR and tool use.

Three levels: the pure aggregation and key sanitising; ``collect_samples`` on a store filled by hand
(every number known, signals attached by tool-call id, by role and to a frozen role's call); and a
short real training run of a two-role agent whose frozen role has a ``/`` in its name.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from lightning_rl import semconv
from lightning_rl.agent import LLM
from lightning_rl.backends.torch_backend import TorchBackendConfig
from lightning_rl.store.memory import MemoryStore
from lightning_rl.tracing import emit_signal, emit_span
from lightning_rl.trainer import Trainer, TrainerConfig
from lightning_rl.trainer.loop import collect_samples
from lightning_rl.trainer.role_metrics import RoleCall, role_key, role_metrics, role_table
from lightning_rl.types import AttemptStatus, RolloutRequest, Span, Task

# --- the pure parts -----------------------------------------------------------------------------


def test_role_key_keeps_metric_keys_one_level_deep_and_mlflow_safe() -> None:
    assert role_key("writer-2.v1") == "writer-2.v1"
    assert role_key("team/writer") == "team_writer"  # a '/' would split train/role/<role>/calls
    assert role_key("a b:c") == "a_b_c"
    assert role_key("..") == "__"  # MLflow rejects names that are not normalised paths
    assert role_key(None) == role_key("") == "unassigned"


def test_role_metrics_aggregate_per_role() -> None:
    calls = [
        RoleCall("writer", trained=True, air=-0.1, tool_error=True, tool_call=True),
        RoleCall("writer", trained=True, air=0.0, tool_error=False, tool_call=True),
        RoleCall("writer", trained=True, air=0.3, tool_error=False, tool_call=False),
        RoleCall("team/critic", trained=False, air=-0.2, tool_error=True, tool_call=True),
        RoleCall(None, trained=False),
    ]
    got = role_metrics("train", calls)
    assert got == pytest.approx(
        {
            "train/role/writer/calls": 3.0,
            "train/role/writer/trained_transitions": 3.0,
            "train/role/writer/air_mean": 0.2 / 3,
            "train/role/writer/tool_error_rate": 1 / 3,
            "train/role/writer/tool_call_rate": 2 / 3,
            "train/role/team_critic/calls": 1.0,
            "train/role/team_critic/trained_transitions": 0.0,
            "train/role/team_critic/air_mean": -0.2,
            "train/role/team_critic/tool_error_rate": 1.0,
            "train/role/team_critic/tool_call_rate": 1.0,
            "train/role/unassigned/calls": 1.0,
            "train/role/unassigned/trained_transitions": 0.0,
            "train/role/unassigned/air_mean": 0.0,
            "train/role/unassigned/tool_error_rate": 0.0,
            "train/role/unassigned/tool_call_rate": 0.0,
        }
    )
    val = role_metrics("val", calls[:1], trained_name="trainable_transitions")
    assert set(val) == {
        f"val/role/writer/{m}"
        for m in ("calls", "trainable_transitions", "air_mean", "tool_error_rate", "tool_call_rate")
    }
    assert role_metrics("train", []) == {}


def test_roles_that_share_a_key_are_pooled_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    calls = [RoleCall("team/a", trained=True, tool_error=True), RoleCall("team_a", trained=False)]
    with caplog.at_level(logging.WARNING, logger="lightning_rl.trainer.role_metrics"):
        got = role_metrics("train", calls)
    assert got["train/role/team_a/calls"] == 2.0 and got["train/role/team_a/tool_error_rate"] == 0.5
    assert "['team/a', 'team_a'] share the metric key 'team_a'" in caplog.text


def test_role_table_gives_first_and_last_value_per_role() -> None:
    history = [
        {"step": 0.0, "val/reward_mean": 0.1, "val/role/writer/calls": 2.0},
        {"step": 1.0, "train/role/writer/calls": 4.0, "train/role/writer/air_mean": -0.1},
        {"step": 2.0, "train/role/writer/calls": 6.0, "train/role/critic/calls": 1.0, "train/reward_mean": 0.5},
        {"step": 3.0, "train/role/writer/calls": 5.0, "train/role/writer/air_mean": -0.02},
    ]
    assert role_table(history) == {
        "critic": {"calls": (1.0, 1.0)},  # seen in one step only
        "writer": {"calls": (4.0, 5.0), "air_mean": (-0.1, -0.02)},
    }
    assert role_table(history, "val") == {"writer": {"calls": (2.0, 2.0)}}
    assert role_table([]) == {}


# --- collect_samples on a hand-made store ---------------------------------------------------------


def _call(role: str | None, start: int, *, tool_call_id: str | None = None, response_id: str | None = None) -> Span:
    attrs: dict[str, Any] = {
        semconv.PROMPT_TOKEN_IDS: [1, 2, 3],
        semconv.RESPONSE_TOKEN_IDS: [4, 5],
        semconv.TOOL_CALLS: json.dumps(
            [{"id": tool_call_id, "name": "lookup", "arguments": "{}"}] if tool_call_id else []
        ),
    }
    if role is not None:
        attrs[semconv.ROLE] = role
    if response_id is not None:
        attrs[semconv.GEN_AI_RESPONSE_ID] = response_id
    return Span(
        name=semconv.SPAN_LLM_CALL, rollout_id="", attempt_id="", start_ns=start, end_ns=start + 100, attributes=attrs
    )


def _span(name: str, start: int, **attrs: Any) -> Span:
    return Span(name=name, rollout_id="", attempt_id="", start_ns=start, end_ns=start + 1, attributes=attrs)


# Per rollout, its spans in time order. r1: a trainable writer and a frozen "team/critic" (declared
# as a plugin would), a call with no role; r2: a writer alone, nothing declared (so it trains).
ROLLOUTS: dict[str, list[Span]] = {
    "r1": [
        _span(semconv.SPAN_AGENT, 10, **{semconv.ROLE: "writer", semconv.TRAINABLE: True}),
        _span(semconv.SPAN_AGENT, 11, **{semconv.ROLE: "team/critic", semconv.TRAINABLE: False}),
        _call("writer", 100, tool_call_id="w1"),
        # the writer's tool failed: joined on the tool-call id
        _span(semconv.SPAN_TOOL, 210, **{semconv.GEN_AI_TOOL_CALL_ID: "w1", semconv.TOOL_STATUS: "error"}),
        _call("team/critic", 300, tool_call_id="k1"),
        # a tool error on the frozen role's call: counted for the critic, never for the writer
        _span(semconv.SPAN_SIGNAL, 410, **{semconv.SIGNAL_NAME: "tool_error", semconv.GEN_AI_TOOL_CALL_ID: "k1"}),
        # a writer call whose role comes from a plugin span joined on the response id
        _call(None, 500, response_id="resp-3"),
        _span(
            semconv.SPAN_AGENT,
            605,
            **{semconv.ROLE: "writer", semconv.GEN_AI_RESPONSE_ID: "resp-3", semconv.TRAINABLE: True},
        ),
        _span(semconv.SPAN_SIGNAL, 610, **{semconv.SIGNAL_NAME: "tool_success", semconv.ROLE: "writer"}),
        _call(None, 700),
    ],
    "r2": [
        _call("writer", 100, tool_call_id="w2"),
        _span(semconv.SPAN_TOOL, 210, **{semconv.GEN_AI_TOOL_CALL_ID: "w2", semconv.TOOL_STATUS: "error"}),
    ],
}


async def test_collect_samples_reports_every_role_and_trains_only_the_trainable_one() -> None:
    store = MemoryStore()
    await store.enqueue([RolloutRequest(id=r, task=Task(input={}), group_id="g") for r in ROLLOUTS])
    for _ in ROLLOUTS:
        (claim,) = await store.claim("w")
        ids = {"rollout_id": claim.rollout.id, "attempt_id": claim.attempt.id}
        await store.add_spans([s.model_copy(update=ids) for s in ROLLOUTS[claim.rollout.id]])
        await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    rollouts = [await store.get_rollout(r) for r in ROLLOUTS]

    collected = await collect_samples(store, rollouts, trainable=None, air={"tool_error": -0.2, "tool_success": 0.05})

    trained = [t for s in collected.samples for t in s.transitions]
    assert [t.role for t in trained] == ["writer", "writer", "writer"]
    assert collected.n_untrainable == 2
    got = role_metrics("train", collected.role_calls)
    # writer: r1's two calls (tool error -0.2 on the first, tool success +0.05 on the second) and r2's one (-0.2)
    assert got["train/role/writer/calls"] == 3 and got["train/role/writer/trained_transitions"] == 3
    assert got["train/role/writer/air_mean"] == pytest.approx((-0.2 + 0.05 - 0.2) / 3)
    assert got["train/role/writer/tool_error_rate"] == pytest.approx(2 / 3)
    assert got["train/role/writer/tool_call_rate"] == pytest.approx(2 / 3)
    # the frozen critic: its calls are counted, none trained, its tool error is its own
    assert got["train/role/team_critic/calls"] == 1 and got["train/role/team_critic/trained_transitions"] == 0
    assert got["train/role/team_critic/air_mean"] == pytest.approx(-0.2)
    assert got["train/role/team_critic/tool_error_rate"] == 1.0
    assert got["train/role/team_critic/tool_call_rate"] == 1.0
    # the call without a role: untrainable here (a role was declared trainable), no signal, no tool
    assert got["train/role/unassigned/calls"] == 1 and got["train/role/unassigned/trained_transitions"] == 0
    assert got["train/role/unassigned/tool_error_rate"] == 0.0 and got["train/role/unassigned/air_mean"] == 0.0
    # the per-role view adds up to the step's totals
    assert sum(v for k, v in got.items() if k.endswith("/calls")) == collected.n_calls == 5
    assert sum(v for k, v in got.items() if k.endswith("/trained_transitions")) == collected.n_responses


# --- a real run ---------------------------------------------------------------------------------


async def writer_and_frozen_critic(task: dict[str, Any], llm: LLM) -> float:
    """A trainable writer and a frozen critic (a '/' in its name); the writer's tool fails on ``err`` tasks."""
    writer = llm.for_role("writer").async_openai_client(max_retries=0)
    critic = llm.for_role("team/critic").async_openai_client(max_retries=0)
    try:
        emit_span(semconv.SPAN_AGENT, {semconv.ROLE: "writer", semconv.TRAINABLE: True})
        emit_span(semconv.SPAN_AGENT, {semconv.ROLE: "team/critic", semconv.TRAINABLE: False})
        reply = await writer.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], **dict(llm.sampling)
        )
        answer = reply.choices[0].message.content or ""
        if task["err"]:
            emit_signal("tool_error", 1.0, role="writer", tool_name="lookup")
        await critic.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": f"Is this good? {answer}"}], **dict(llm.sampling)
        )
    finally:
        await writer.close()
        await critic.close()
    return (len(answer) % 5) / 4


def _two_role_config(tmp_path: Path, tiny_model_path: Path, **overrides: Any) -> TrainerConfig:
    """Two short steps of 2 tasks x 2 rollouts on the tiny model."""
    settings: dict[str, Any] = {
        "model": str(tiny_model_path),
        "run_dir": str(tmp_path / "run"),
        "steps": 2,
        "batch_size": 2,
        "group_size": 2,
        "max_tokens": 8,
        "val_every": 0,
        "tensorboard": False,
        "progress": False,
        "rollout_timeout_s": 60,
        "backend": TorchBackendConfig(lr=1e-2, old_logprobs="sampled"),
    }
    return TrainerConfig(**{**settings, **overrides})


def test_a_two_role_run_logs_each_role_and_trains_only_the_writer(tmp_path: Path, tiny_model_path: Path) -> None:
    cfg = _two_role_config(tmp_path, tiny_model_path, air={"tool_error": -0.1})
    tasks = [Task(input={"q": "say something about cats", "err": True}), Task(input={"q": "and dogs", "err": False})]
    result = Trainer(cfg).fit(writer_and_frozen_critic, tasks, val_tasks=tasks)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    val = [r for r in rows if "val/reward_mean" in r]
    assert len(train) == 2 and len(val) == 2
    for row in train:
        assert row["train/n_rollouts"] == 4 and row["train/untrainable_calls"] == 4
        writer, critic = "train/role/writer", "train/role/team_critic"
        assert row[f"{writer}/calls"] == 4 and row[f"{critic}/calls"] == 4
        assert row[f"{writer}/trained_transitions"] == row["train/n_transitions"] == 4
        assert row[f"{critic}/trained_transitions"] == 0  # the frozen role's calls stay out of the update
        assert row[f"{writer}/tool_error_rate"] == 0.5  # each task twice, one of the two tasks errs
        assert row[f"{writer}/air_mean"] == pytest.approx(-0.05)
        assert row[f"{critic}/tool_error_rate"] == 0.0 and row[f"{critic}/air_mean"] == 0.0
        assert row[f"{writer}/tool_call_rate"] == 0.0  # no tools offered: the tiny model's text is never a call
        assert not any(k.startswith("train/role/unassigned") for k in row)
    for row in val:  # one rollout per task; validation trains nothing but says what would train
        assert row["val/role/writer/calls"] == 2 and row["val/role/writer/trainable_transitions"] == 2
        assert row["val/role/team_critic/calls"] == 2 and row["val/role/team_critic/trainable_transitions"] == 0
        assert row["val/role/writer/tool_error_rate"] == 0.5
        assert row["val/role/writer/air_mean"] == pytest.approx(-0.05)
    table = role_table(result.history)
    assert list(table) == ["team_critic", "writer"]
    assert table["writer"]["trained_transitions"] == (4.0, 4.0)
    assert table["team_critic"]["calls"] == (4.0, 4.0)
    assert role_table(rows, "val")["writer"]["calls"] == (2.0, 2.0)


def test_untrainable_roles_frozen_keeps_the_critic_on_the_starting_weights(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    cfg = _two_role_config(tmp_path, tiny_model_path, untrainable_roles="frozen")
    tasks = [Task(input={"q": "say something about cats", "err": False}), Task(input={"q": "and dogs", "err": False})]
    result = Trainer(cfg, trainable=["writer"]).fit(writer_and_frozen_critic, tasks, val_tasks=tasks)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    val = [r for r in rows if "val/reward_mean" in r]
    # step 1 samples with the starting weights (version 0); its update publishes version 1 for step 2
    assert [r["train/role/writer/weights_version"] for r in train] == [0.0, 1.0]
    assert [r["train/role/team_critic/weights_version"] for r in train] == [0.0, 0.0]
    assert [r["val/role/writer/weights_version"] for r in val] == [0.0, 2.0]
    assert [r["val/role/team_critic/weights_version"] for r in val] == [0.0, 0.0]
    assert all(r["train/role/team_critic/trained_transitions"] == 0 for r in train)


def test_untrainable_roles_must_be_shared_or_frozen() -> None:
    with pytest.raises(ValueError, match="'shared' or 'frozen'"):
        TrainerConfig(untrainable_roles="kept")  # pyright: ignore[reportArgumentType]
