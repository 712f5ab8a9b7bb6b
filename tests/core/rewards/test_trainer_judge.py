"""The trainer with a judge, end to end on CPU: the tiny model, the real gateway, store and runner,
and a scripted judge over HTTP. The agent emits no reward at all: the judge supplies every one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from lightning_rl.agent import LLM  # noqa: E402
from lightning_rl.backends.torch_backend import TorchBackendConfig  # noqa: E402
from lightning_rl.rewards import JudgeConfig  # noqa: E402
from lightning_rl.testing.fake_judge import FakeJudge  # noqa: E402
from lightning_rl.trainer import Trainer, TrainerConfig  # noqa: E402
from lightning_rl.types import Task  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model_path() -> Path:
    from lightning_rl.engine.tiny import default_tiny_model

    return default_tiny_model()


async def unrewarded_agent(task: dict[str, Any], llm: LLM) -> None:
    """One chat call and no reward: what an agent without a gold answer looks like."""
    client = llm.async_openai_client(max_retries=0)
    try:
        await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], **dict(llm.sampling)
        )
    finally:
        await client.close()


def _by_length(text: str) -> float:
    """The scripted judge's taste: longer answers are better (varied, so groups have advantages)."""
    answer = text.split("assistant: ", 1)[-1].split("\n", 1)[0]
    return min(len(answer), 40) / 40


def _fit(tmp_path: Path, model: Path, judge: FakeJudge, **judge_settings: Any) -> list[dict[str, Any]]:
    tasks = [Task(input={"q": f"say something about {w}"}) for w in ("cats", "dogs", "rain")]
    with judge.serving_in_thread() as url:
        settings: dict[str, Any] = {"model": "fake-judge", "base_url": url, "api_key": "sk-secret", "backoff_s": 0.001}
        config = TrainerConfig(
            model=str(model),
            run_dir=str(tmp_path / "run"),
            steps=2,
            batch_size=3,
            group_size=4,
            max_tokens=8,
            val_every=0,
            tensorboard=False,
            progress=False,
            rollout_timeout_s=30,
            backend=TorchBackendConfig(lr=1e-2, old_logprobs="sampled"),
            judge=JudgeConfig(**{**settings, **judge_settings}),
        )
        result = Trainer(config).fit(unrewarded_agent, tasks)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/judge_calls" in r]


def test_judge_scores_train_an_agent_that_emits_no_reward(tmp_path: Path, tiny_model_path: Path) -> None:
    judge = FakeJudge(_by_length)
    rows = _fit(tmp_path, tiny_model_path, judge)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["train/judge_calls"] == 3 and row["train/judge_groups"] == 3  # one call per task group
        assert row["train/judge_excluded_rollouts"] == 0 and row["train/failed_rollouts"] == 0
        assert row["train/n_transitions"] == 12 and row["train/n_updated_transitions"] > 0
        assert row["train/judge_prompt_tokens"] > 0 and 0.0 <= row["train/judge_score_mean"] <= 1.0
    assert all(len(shown) == 4 for shown in judge.shown)
    assert judge.headers[0]["authorization"] == "Bearer sk-secret"
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert written["judge"]["api_key"] == "***" and written["judge"]["model"] == "fake-judge"
    assert len(list((tmp_path / "run" / "judge_cache").rglob("*.json"))) == 6


def test_groups_the_judge_cannot_score_are_left_out_of_the_update(tmp_path: Path, tiny_model_path: Path) -> None:
    judge = FakeJudge(_by_length, faults=["malformed"] * 100)
    rows = _fit(tmp_path, tiny_model_path, judge, max_retries=1)
    for row in rows:
        assert row["train/judge_failed_groups"] == 3 and row["train/judge_excluded_rollouts"] == 12
        assert row["train/n_transitions"] == 0 and row["train/n_updated_transitions"] == 0  # nothing scored 0
        assert row["train/judge_errors/malformed"] == 6 and row["train/judge_retries"] == 3
