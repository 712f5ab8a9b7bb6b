"""The RAG example (examples/rag_agent): its retrieval and reward, and a short end-to-end training run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rag_agent"


def _load(name: str) -> ModuleType:
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    spec = importlib.util.spec_from_file_location(f"rag_example_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_bm25_finds_each_hop_and_the_questions_are_answerable_from_the_corpus() -> None:
    data, search = _load("rag_data"), _load("rag_search")
    docs = data.load_corpus()
    assert docs == data.build_corpus()  # the bundled file is what the generator makes
    index = search.BM25([str(d["text"]) for d in docs])
    questions = data.make_questions(docs)
    assert len(questions) == 120 and {q.hops for q in questions} == {2, 3}
    q = questions[0]
    first, second = (docs[i] for i in q.support)
    assert index.search(f"{first['subject']} born")[0] == first["text"]
    assert index.search(f"{second['subject']} country")[0] == second["text"] and q.answer in str(second["text"])


def test_reward_is_f1_with_a_format_bonus() -> None:
    agent = _load("rag_agent")
    assert agent.reward("Answer: Morvania", "Morvania") == pytest.approx(1.0)
    assert agent.reward("Morvania", "Morvania") == pytest.approx(0.9)  # right, but not in the format
    assert agent.reward("notes...\nAnswer: north Morvania", "Morvania") == pytest.approx(0.9 * 2 / 3 + 0.1)
    assert agent.reward("Answer: Quelland", "Morvania") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="empty"):
        agent.search_corpus("  ")


@pytest.mark.slow
def test_the_example_trains_end_to_end_and_writes_metrics(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from lightning_openai_agents import uninstrument

    train = _load("train")
    out = tmp_path / "run"
    argv = ["--steps", "2", "--batch-size", "2", "--group-size", "2", "--n-val", "2", "--max-tokens", "24"]
    try:
        result = train.main([*argv, "--warm-start-steps", "2", "--out", str(out), "--no-progress"])
    finally:
        uninstrument()
    assert result is not None and 0.0 <= result <= 1.0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert row["train/n_rollouts"] == 4 and row["train/failed_rollouts"] == 0
        # every rollout reaches the answerer (trained); the planner's calls are recorded, not trained
        assert row["train/n_transitions"] >= 4 and row["train/untrainable_calls"] >= 4
    assert json.loads((out / "warm_start" / "warm_start.json").read_text())["examples"] > 0


@pytest.mark.slow
def test_the_run_file_trains_the_same_app_with_lightning_rl_train(tmp_path: Path) -> None:
    """``lightning-rl train examples/rag_agent/config.toml``, short: the session instruments the SDK
    (the answerer trains, the planner is recorded) and uninstruments it when the run ends."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from lightning_openai_agents import OpenAIAgentsInstrumentor
    from lightning_rl.cli import main

    out = tmp_path / "run"
    overrides = [
        f"run_dir={out}",
        "val_tasks=null",
        "warm_start.steps=2",
        "algorithm.steps=2",
        "algorithm.batch_size=2",
        "algorithm.group_size=2",
        "algorithm.concurrency=4",
        "algorithm.max_tokens=24",
    ]
    argv = ["train", str(EXAMPLE / "config.toml"), "--quiet", *[a for o in overrides for a in ("--set", o)]]
    assert main(argv) == 0
    assert not OpenAIAgentsInstrumentor().is_instrumented  # the session's exit uninstrumented

    assert json.loads((out / "warm_start" / "warm_start.json").read_text())["examples"] > 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert row["train/n_rollouts"] == 4 and row["train/failed_rollouts"] == 0
        # the plugin routed both agents: the answerer's calls trained, the planner's recorded only
        assert row["train/n_transitions"] >= 4 and row["train/untrainable_calls"] >= 4
