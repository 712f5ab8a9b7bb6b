"""The APO example (examples/apo) runs offline end to end: the embedded tiny model is both the agent's
model and the optimiser. The tiny model writes gibberish prompts, so nothing is asserted about
improvement; the test checks the run completes, scores and history are stored, and the best-scoring
prompt is the one kept (in the result, the run folder and the store's latest resources)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "apo"


def _load(name: str) -> ModuleType:
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    spec = importlib.util.spec_from_file_location(f"apo_example_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_reward_prefers_the_bare_answer() -> None:
    agent = _load("apo_agent")
    assert agent.score("Paris", "Paris") == 1.0
    assert agent.score("paris.\nIt is in France.", "Paris") == 1.0
    chatty = agent.score("Sure! The capital of France is Paris.", "Paris")
    assert 0.0 < chatty < 1.0
    assert agent.score("", "Paris") == 0.0


@pytest.mark.slow
async def test_the_example_runs_offline_and_keeps_the_best_prompt(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from lightning_rl.algorithms.apo import APO, load_apo_state
    from lightning_rl.store.sqlite import SQLiteStore

    train = _load("train")
    config, agent, train_tasks, val_tasks = train.load(EXAMPLE / "config.toml")
    config.rounds = 1
    config.run_dir = str(tmp_path / "run")
    config.progress = False
    result = await APO(config).fit_async(agent, train_tasks, val_tasks[:4])

    assert result.val_before is not None and math.isfinite(result.val_before)
    assert result.val_after is not None and math.isfinite(result.val_after)
    rounds = [r for r in result.history if "train/reward_mean" in r]
    assert [r["step"] for r in rounds] == [0.0, 1.0]
    assert rounds[1]["apo/new_candidates"] + rounds[1]["apo/rejected_edits"] == config.candidates_per_round
    scored = [c for c in result.candidates if 1 in c.scores]
    best_score = max(c.scores[1] for c in scored)
    assert next(c for c in result.candidates if c.version == result.best_version).scores[1] == best_score
    assert (result.run_dir / "best_prompt.txt").read_bytes().decode("utf-8") == result.best_prompt
    assert len(json.loads((result.run_dir / "candidates.json").read_text())) == len(result.candidates)
    assert len((result.run_dir / "metrics.jsonl").read_text().splitlines()) == len(result.history)

    store = SQLiteStore(result.run_dir / "store.sqlite")
    try:
        assert (await store.get_resources()).prompts == {"system": result.best_prompt}
        state = await load_apo_state(store)
        assert state is not None and state["best_version"] == result.best_version
        assert {c["id"]: c["scores"] for c in state["candidates"]} == {
            c.id: {str(k): v for k, v in c.scores.items()} for c in result.candidates
        }
    finally:
        await store.close()
