"""APO end to end on the real store, gateway and runner, with a scripted optimiser.

The only double is ``FakeUpstream`` (lightning_rl.testing), the scripted OpenAI-compatible server:
it plays both the agent's model (it answers "42" only when the system prompt asks to think step by
step, so the agent's reward depends on the prompt) and the optimiser LLM (it writes a critique,
then alternately a good and a bad edit). Everything else is real: the SQLite store, the gateway
recording spans, the runner executing the agent, APO's loop.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lightning_rl.agent import LLM
from lightning_rl.algorithms.apo import APO, APOConfig, load_apo_state, prompt_template
from lightning_rl.algorithms.apo_optimizer import OptimizerError
from lightning_rl.gateway import running_gateway
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.testing import FakeUpstream
from lightning_rl.types import Task

GOOD = "Think step by step and give the final number."
BAD = "Answer as fast as you can."
INITIAL = "You are a helpful assistant."


def _text(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in body["messages"])


class ScriptedModel:
    """The fake upstream's replies: the agent's model and the optimiser, told apart by the request."""

    def __init__(self) -> None:
        self.edits = itertools.count()
        self.critique_requests: list[str] = []

    def __call__(self, body: dict[str, Any]) -> str:
        text = _text(body)
        if "improve the prompt template" in text:  # the optimiser's system message
            if "Do not rewrite the template yet" in text:
                self.critique_requests.append(text)
                return "The prompt never asks the agent to reason before answering."
            return f"<prompt>{GOOD if next(self.edits) % 2 == 0 else BAD}</prompt>"
        system = str(body["messages"][0]["content"])
        return "It is 42." if "step by step" in system else "I don't know."


async def answer_agent(task: dict[str, str], llm: LLM) -> float:
    """Asks the model with the candidate prompt as its system message; 1.0 for the right answer."""
    client = llm.async_openai_client(max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model=llm.model,
            messages=[
                {"role": "system", "content": prompt_template("system")},
                {"role": "user", "content": task["question"]},
            ],
            **dict(llm.sampling),
        )
    finally:
        await client.close()
    return 1.0 if "42" in (reply.choices[0].message.content or "") else 0.0


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, ScriptedModel, FakeUpstream]]:
    model = ScriptedModel()
    fake = FakeUpstream(model="fake-model", responder=model)
    async with running_gateway(fake.app) as url:
        yield url, model, fake


def _config(tmp_path: Path, url: str, **overrides: Any) -> APOConfig:
    settings: dict[str, Any] = {
        "initial_prompt": INITIAL,
        "rounds": 2,
        "beam_width": 2,
        "candidates_per_round": 2,
        "tasks_per_eval": 4,
        "concurrency": 16,
        "llm_base_url": f"{url}/v1",
        "optimizer_base_url": f"{url}/v1",
        "optimizer_model": "fake-model",
        "run_dir": str(tmp_path / "run"),
        "progress": False,
        **overrides,
    }
    return APOConfig(**settings)


TRAIN = [Task(input={"question": f"What is 6 x 7? (variant {i})"}) for i in range(6)]
VAL = [Task(input={"question": f"What is 40 + 2? (variant {i})"}) for i in range(3)]


async def test_beam_keeps_the_better_prompt_and_the_store_keeps_the_scores(
    tmp_path: Path, upstream: tuple[str, ScriptedModel, FakeUpstream]
) -> None:
    url, model, _ = upstream
    result = await APO(_config(tmp_path, url)).fit_async(answer_agent, TRAIN, VAL)

    assert result.best_prompt == GOOD
    assert (result.val_before, result.val_after) == (0.0, 1.0)
    by_template = {c.template: c for c in result.candidates}
    assert set(by_template) == {INITIAL, GOOD, BAD}  # round 2's edits repeat earlier prompts: rejected
    assert by_template[GOOD].scores == {1: 1.0, 2: 1.0}
    assert by_template[BAD].scores == {1: 0.0}  # beaten by the good edit and, on a tie, by the older initial
    assert by_template[INITIAL].scores == {0: 0.0, 1: 0.0, 2: 0.0}
    assert by_template[GOOD].critique and by_template[GOOD].parent == by_template[INITIAL].id

    # the optimiser read the failures as transcripts rendered from the spans the gateway recorded
    first = model.critique_requests[0]
    assert "I don't know." in first and "What is 6 x 7?" in first and INITIAL in first and "reward: 0.000" in first

    rows = [r for r in result.history if "train/reward_mean" in r]
    assert [r["step"] for r in rows] == [0.0, 1.0, 2.0]
    assert [r["train/reward_mean"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["apo/new_candidates"] for r in rows] == [0.0, 2.0, 0.0]
    assert rows[2]["apo/rejected_edits"] == 2.0
    lines = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(result.history) and json.loads(lines[-1])["val/reward_mean"] == 1.0
    assert (result.run_dir / "best_prompt.txt").read_text() == GOOD

    # the store: the latest resources are the best prompt, with every candidate's score history
    store = SQLiteStore(result.run_dir / "store.sqlite")
    try:
        latest = await store.get_resources()
        assert latest.prompts == {"system": GOOD}
        state = await load_apo_state(store)
        assert state is not None and state["best_version"] == result.best_version
        assert state["val_before"] == 0.0 and state["val_after"] == 1.0
        stored = {c["template"]: c["scores"] for c in state["candidates"]}
        assert stored == {INITIAL: {"0": 0.0, "1": 0.0, "2": 0.0}, GOOD: {"1": 1.0, "2": 1.0}, BAD: {"1": 0.0}}
        candidate_version = await store.get_resources(result.best_version)
        assert candidate_version.prompts == {"system": GOOD}
        # each rollout ran with its candidate's resources version
        rollouts = await store.query_rollouts(limit=1000)
        assert rollouts and all(
            r.resources_version == by_template_version(result, str(r.metadata["apo_candidate"])) for r in rollouts
        )
    finally:
        await store.close()


def by_template_version(result: Any, cid: str) -> int:
    return next(c.version for c in result.candidates if c.id == cid)


async def test_an_unreachable_optimiser_stops_the_run_with_its_error(
    tmp_path: Path, upstream: tuple[str, ScriptedModel, FakeUpstream]
) -> None:
    url, _, _ = upstream
    cfg = _config(tmp_path, url, optimizer_model="no-such-model", rounds=1)
    with pytest.raises(OptimizerError, match="404"):
        await APO(cfg).fit_async(answer_agent, TRAIN)


async def test_failed_rollouts_count_as_failed_reward_and_reach_the_critique(
    tmp_path: Path, upstream: tuple[str, ScriptedModel, FakeUpstream]
) -> None:
    url, model, _ = upstream

    async def crashing_agent(task: dict[str, str], llm: LLM) -> float:
        if "step by step" not in prompt_template("system"):
            raise RuntimeError("could not parse the model's answer")
        return await answer_agent(task, llm)

    result = await APO(_config(tmp_path, url, rounds=1)).fit_async(crashing_agent, TRAIN)
    initial = next(c for c in result.candidates if c.template == INITIAL)
    assert initial.scores == {0: 0.0, 1: 0.0}  # failed rollouts score failed_reward (0), not nothing
    assert result.best_prompt == GOOD
    assert result.history[0]["apo/failed_rollouts"] == 4.0
    assert "could not parse the model's answer" in model.critique_requests[0]
    assert "outcome: failed" in model.critique_requests[0]


def test_config_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="beam_width"):
        APOConfig(beam_width=0)
    with pytest.raises(ValueError, match="initial_prompt"):
        APOConfig(initial_prompt="  ")


def test_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LIGHTNING_APO_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    assert APOConfig().resolved_api_key() == "sk-from-env"
    monkeypatch.setenv("LIGHTNING_APO_API_KEY", "apo-key")
    assert APOConfig().resolved_api_key() == "apo-key"
    assert APOConfig(optimizer_api_key="explicit").resolved_api_key() == "explicit"
    assert APOConfig(optimizer_api_key="explicit").public_dict()["optimizer_api_key"] == "***"


def test_prompt_template_outside_a_rollout() -> None:
    assert prompt_template("system", default="fallback") == "fallback"
    with pytest.raises(LookupError, match="outside any rollout"):
        prompt_template("system")


def test_nan_scores_are_stored_as_null() -> None:
    from lightning_rl.algorithms.apo import Candidate

    record = Candidate(id="c0", template="t", version=1, scores={0: math.nan}).record()
    assert record["scores"] == {"0": None}


def test_apo_is_registered_with_its_config_class() -> None:
    from lightning_rl.algorithms import get_algorithm

    entry = get_algorithm("apo")
    assert entry.load() is APO
    assert entry.config_class() is APOConfig


def test_fit_needs_the_agent() -> None:
    with pytest.raises(ValueError, match="in-process"):
        APO(APOConfig(progress=False)).fit(None, [Task(input=1)])


def test_agent_model_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LIGHTNING_APO_LLM_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert APOConfig().resolved_llm_api_key() is None
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    assert APOConfig().resolved_llm_api_key() == "sk-from-env"
    monkeypatch.setenv("LIGHTNING_APO_LLM_API_KEY", "llm-key")
    assert APOConfig().resolved_llm_api_key() == "llm-key"
