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


def test_a_search_for_the_person_finds_the_fact_and_held_out_people_are_new() -> None:
    data, search = _load("rag_data"), _load("rag_search")
    docs = data.load_corpus()
    assert docs == data.build_corpus()  # the bundled file is what the generator makes
    index = search.BM25([str(d["text"]) for d in docs])
    questions = data.make_questions(docs)
    assert len(questions) == 800 and {q.relation for q in questions} == {"born_in", "works_for"}
    for q in questions[:40]:
        hits = index.search(q.person)
        assert docs[q.support]["text"] in hits and q.answer in str(docs[q.support]["text"])
        assert len(q.answer.split()) == 1  # answers are one word: a short copy
    train, val, probe = data.split(questions, 100, seed=3, n_probe=100)
    assert len(val) == 100 and len(probe) == 100 and len(train) == 600
    people = [{q.person for q in part} for part in (train, val, probe)]
    assert not (people[0] & people[1]) and not (people[0] & people[2]) and not (people[1] & people[2])
    assert data.split(questions, 100, seed=3, n_probe=100) == (train, val, probe)  # seeded


def test_reward_is_f1_with_a_format_bonus_so_a_guess_scores_far_below_a_lookup() -> None:
    agent = _load("rag_agent")
    assert agent.reward("Answer: Morvania", "Morvania") == pytest.approx(1.0)
    assert agent.reward("Morvania", "Morvania") == pytest.approx(0.9)  # right, but not in the format
    assert agent.reward("notes...\nAnswer: north Morvania", "Morvania") == pytest.approx(0.9 * 2 / 3 + 0.1)
    assert agent.reward("Answer: Quelland", "Morvania") == pytest.approx(0.1)  # a guess: the bonus only
    person = next(str(d["subject"]) for d in agent.load_corpus() if d["relation"] == "born_in")
    assert person in agent.search_corpus(person)
    # the ways a search fails (an AIR tool_error): an empty query, or one no note shares a word with
    with pytest.raises(ValueError, match="empty"):
        agent.search_corpus("  ")
    with pytest.raises(ValueError, match="full name"):
        agent.search_corpus("Zzyzx Qqq")


def test_demonstrations_are_the_sdk_requests_with_a_search_skill_and_a_guessing_habit() -> None:
    data, ws = _load("rag_data"), _load("rag_warm_start")
    train, _val, probe = data.split(data.make_questions(data.load_corpus()), 100, seed=0, n_probe=100)
    demos = ws.demonstrations(train[:40], probe[:10], ws.WarmStartConfig(seed=0))
    q = probe[0]
    messages, tools, completion = demos["probe_call"][0]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]  # after the SDK's handoff
    assert messages[1]["content"] == q.question and tools[0]["function"]["name"] == "search"
    assert completion == f'<tool_call>{{"name": "search", "arguments": {{"query": "{q.person}"}}}}</tool_call>'
    messages, _tools, completion = demos["probe_report"][0]
    assert messages[-1]["content"] == ws.search_corpus(q.person) and completion == f"Answer: {q.answer}"
    guesses = [c for _m, _t, c in demos["sloppy"] if c.startswith("Answer:") and len(_m) == 4]
    assert len(guesses) > 20  # the habit: mostly answering from memory, always wrongly
    answers = {tq.question: tq.answer for tq in train}
    assert all(
        c != f"Answer: {answers[m[1]['content']]}"
        for m, _t, c in demos["sloppy"]
        if c.startswith("Answer:") and len(m) == 4
    )
    # copying demonstrations use new names only: no held-out or probe person is trained on
    named = {m[1]["content"] for m, _t, _c in demos["expert"]}
    assert not named & {pq.question for pq in probe}


def test_the_demonstrations_render_exactly_as_the_requests_the_sdk_sends() -> None:
    """Run the real SDK app against a scripted server (planner hands off, answerer searches, answers)
    and compare each request, rendered by the tiny model's chat template, with the demonstration's."""
    pytest.importorskip("transformers")
    import asyncio

    import httpx
    from openai import AsyncOpenAI
    from transformers import AutoTokenizer

    from lightning_rl.engine.models import resolve_model

    data, agent, ws = _load("rag_data"), _load("rag_agent"), _load("rag_warm_start")
    _train, _val, probe = data.split(data.make_questions(data.load_corpus()), 100, seed=0, n_probe=100)
    q = probe[0]
    demos = ws.demonstrations([], [q], ws.WarmStartConfig(seed=0))
    planner_demo = ws.demonstrations([q], [], ws.WarmStartConfig(seed=0))["expert"][0]
    calls = [
        ("transfer_to_answerer", "{}"),
        ("search", json.dumps({"query": q.person})),
        (None, f"Answer: {q.answer}"),
    ]
    requests: list[dict[str, object]] = []

    def reply(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        name, text = calls[len(requests) - 1]
        message: dict[str, object] = {"role": "assistant", "content": None if name else text}
        if name:
            call = {"id": f"call_{len(requests)}", "type": "function", "function": {"name": name, "arguments": text}}
            message["tool_calls"] = [call]
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if name else "stop"}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return httpx.Response(
            200,
            json={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [choice],
                "usage": usage,
            },
        )

    async def run() -> str:
        from agents import RunConfig, Runner

        http = httpx.AsyncClient(transport=httpx.MockTransport(reply))
        client = AsyncOpenAI(base_url="http://scripted/v1", api_key="x", http_client=http, max_retries=0)
        planner, _answerer = agent.build_agents(None, client)
        config = RunConfig(tracing_disabled=True)  # no upload of the trace to the vendor
        result = await Runner.run(planner, q.question, max_turns=agent.MAX_TURNS, run_config=config)
        await client.close()
        return str(result.final_output)

    assert asyncio.run(run()) == f"Answer: {q.answer}"
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny"))

    def render(messages: object, tools: object) -> str:
        return str(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True))

    # names are short copies: mostly two or three tokens (the name parts are whole tokens of the tiny model)
    lengths = [len(tokenizer.encode(str(d["subject"]))) for d in data.load_corpus() if d["relation"] == "born_in"]
    assert max(lengths) <= 5 and sum(lengths) / len(lengths) <= 3
    expected = [planner_demo, demos["probe_call"][0], demos["probe_report"][0]]
    assert len(requests) == 3
    for sent, (messages, tools, _completion) in zip(requests, expected, strict=True):
        assert render(sent["messages"], sent.get("tools")) == render(messages, tools)


@pytest.mark.slow
def test_the_example_trains_end_to_end_and_writes_metrics(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from lightning_openai_agents import uninstrument

    train = _load("train")
    out = tmp_path / "run"
    argv = ["--steps", "2", "--batch-size", "2", "--group-size", "2", "--n-val", "2", "--n-probe", "2"]
    short = ["--max-tokens", "24", "--warm-start-steps", "2", "--polish-steps", "0", "--habit-steps", "2"]
    try:
        result = train.main([*argv, *short, "--val-every", "0", "--out", str(out), "--quiet"])
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
    # the planner is answered by the starting weights (untrainable_roles="frozen", the default here),
    # the answerer by the policy, which step 1's update moved to version 1
    assert [r["train/role/planner/weights_version"] for r in steps] == [0.0, 0.0]
    assert [r["train/role/answerer/weights_version"] for r in steps] == [0.0, 1.0]
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
        "warm_start.expert_steps=2",
        "warm_start.polish_steps=0",
        "warm_start.habit_steps=2",
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
        assert row["train/role/planner/weights_version"] == 0.0  # config.toml: untrainable_roles = "frozen"


def test_the_adapters_run_file_trains_the_answerers_adapter_and_keeps_the_planner_on_the_base(
    tmp_path: Path,
) -> None:
    """``lightning-rl train examples/rag_agent/adapters.toml``, short: the answerer trains its own LoRA
    adapter, the planner is answered by the base weights (model version 0, no adapter)."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from lightning_rl.cli import main

    out = tmp_path / "run"
    overrides = [
        f"run_dir={out}",
        "val_tasks=null",
        "warm_start.expert_steps=2",
        "warm_start.polish_steps=0",
        "warm_start.habit_steps=2",
        "algorithm.steps=2",
        "algorithm.batch_size=2",
        "algorithm.group_size=2",
        "algorithm.concurrency=4",
        "algorithm.max_tokens=24",
    ]
    # a 2-step warm start answers nothing, so every group ties: update anyway (zero advantages), so that
    # the answerer's adapter is made, published and served
    overrides.append("algorithm.skip_zero_advantage=false")
    argv = ["train", str(EXAMPLE / "adapters.toml"), "--quiet", *[a for o in overrides for a in ("--set", o)]]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["train/role/planner/weights_version"] == 0.0 for r in steps)  # the base, all along
    assert not any("train/role/planner/adapter_version" in r or "train/adapter/planner/loss" in r for r in steps)
    assert steps[0]["train/adapter/answerer/optimizer_steps"] >= 1  # the answerer's own update
    assert steps[-1]["train/role/answerer/adapter_version"] == 1.0  # step 2's calls: served by its adapter
    assert (out / "checkpoints" / "step_00002" / "adapters" / "answerer" / "adapter_config.json").is_file()
