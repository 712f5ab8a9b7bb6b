"""``lightning-rl train``'s run file: parsed, overridden and checked before anything starts.

Each bad file must fail with a message that names the key and the fix; nothing here trains.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import types
from collections.abc import AsyncGenerator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from lightning_rl.algorithms.base import TrainResult  # noqa: E402
from lightning_rl.cli import main  # noqa: E402
from lightning_rl.trainer.run_file import ConfigError, load_run_file, run_plan  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

AGENT = """
async def agent(task, llm):
    return 1.0
"""


def _write(tmp_path: Path, body: str, name: str = "run.toml") -> Path:
    (tmp_path / "my_agent.py").write_text(AGENT)
    (tmp_path / "train.jsonl").write_text('{"id": "t1", "input": {"q": "a"}}\n{"q": "b"}\n')
    path = tmp_path / name
    path.write_text(body)
    return path


BASE = """
agent = "my_agent:agent"
train_tasks = "train.jsonl"
model = "tiny"
[algorithm]
name = "grpo"
steps = 2
"""


def test_a_valid_file_resolves_agent_tasks_and_config(tmp_path: Path) -> None:
    plan = load_run_file(_write(tmp_path, BASE))
    assert plan.entry.name == "grpo" and plan.config.steps == 2 and plan.config.model == "tiny"
    assert [t.id for t in plan.train_tasks] == ["t1", None] and plan.train_tasks[1].input == {"q": "b"}
    assert plan.val_tasks == [] and callable(plan.agent)


def test_presets_apply_under_the_users_options(tmp_path: Path) -> None:
    plan = load_run_file(_write(tmp_path, BASE.replace('"grpo"', '"ppo"') + "[algorithm.backend]\nmini_batches = 2\n"))
    assert plan.config.backend.ppo_epochs == 4 and plan.config.backend.mini_batches == 2


def test_set_overrides_nested_keys_with_json_values(tmp_path: Path) -> None:
    plan = load_run_file(
        _write(tmp_path, BASE),
        ["algorithm.steps=5", "algorithm.backend.lr=0.001", "algorithm.air.tool_error=-0.2", "run_dir=runs/x"],
    )
    assert plan.config.steps == 5 and plan.config.backend.lr == 1e-3 and plan.config.air == {"tool_error": -0.2}
    assert plan.config.run_dir == "runs/x"


def test_the_runs_seed_seeds_the_backend_unless_set_apart(tmp_path: Path) -> None:
    plan = load_run_file(_write(tmp_path, "seed = 7\n" + BASE))
    assert plan.config.seed == 7 and plan.config.backend.seed == 7
    plan = load_run_file(_write(tmp_path, "seed = 7\n" + BASE + "[algorithm.backend]\nseed = 3\n"))
    assert plan.config.seed == 7 and plan.config.backend.seed == 3


def test_secrets_are_masked_in_what_is_printed_and_copied() -> None:
    from lightning_rl.trainer.run_file import masked

    raw = {"algorithm": {"optimizer_api_key": "sk-live", "llm_api_key": None, "steps": 2}, "store_token": "t"}
    assert masked(raw) == {
        "algorithm": {"optimizer_api_key": "***", "llm_api_key": None, "steps": 2},
        "store_token": "***",
    }


def test_yaml_files_work_like_toml(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    body = "agent: my_agent:agent\ntrain_tasks: train.jsonl\nalgorithm:\n  name: sft\n  top_k: 1\n  min_reward: null\n"
    plan = load_run_file(_write(tmp_path, body, "run.yaml"))
    assert plan.entry.name == "sft" and plan.config.top_k == 1 and plan.config.min_reward is None


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s + "stpes = 3\n", r"algorithm\.stpes: unknown key; did you mean 'steps'\?"),
        (lambda s: "agnet = 'x:y'\n" + s, r"agnet: unknown key; did you mean 'agent'\?"),
        (lambda s: s.replace("steps = 2", 'steps = "two"'), r"algorithm\.steps: expected an integer, got 'two'"),
        (lambda s: s.replace("steps = 2", "steps = 0"), r"algorithm: TrainerConfig\.steps must be >= 1"),
        (lambda s: s + 'estimator = "ppo"\n', r"algorithm\.estimator: must be one of 'grpo', 'grpo_no_std', 'rloo'"),
        (lambda s: s.replace('"grpo"', '"reinforce"'), r"algorithm\.name: unknown algorithm 'reinforce'; known: grpo"),
        (lambda s: s.replace("train.jsonl", "missing.jsonl"), r"train_tasks: tasks file .*missing\.jsonl not found"),
        (lambda s: s.replace("my_agent:agent", "no_such_module:agent"), r"agent: cannot import 'no_such_module'"),
        (lambda s: s.replace("my_agent:agent", "my_agent:nope"), r"agent: module my_agent has no 'nope'"),
        (lambda s: s.replace('agent = "my_agent:agent"', ""), r"agent: missing; add agent = 'module:function'"),
        (lambda s: s + "[algorithm.backend]\nlrr = 1\n", r"algorithm\.backend\.lrr: unknown key; did you mean 'lr'\?"),
        (lambda s: s + 'model = "tiny"\n', r"model is set twice \(top level and algorithm\.model\)"),
    ],
)
def test_bad_files_name_the_key_and_the_fix(tmp_path: Path, edit: object, message: str) -> None:
    body = edit(BASE)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=message):
        load_run_file(_write(tmp_path, body))


def test_a_bad_override_is_explained(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="write key=value"):
        load_run_file(_write(tmp_path, BASE), ["algorithm.steps"])


def test_the_cli_reports_config_errors_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, BASE.replace("steps = 2", "stepz = 2"))
    assert main(["train", str(path)]) == 2
    assert "lightning-rl: error: algorithm.stepz: unknown key; did you mean 'steps'?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["calculator/grpo.toml", "calculator/sft.toml", "apo/config.toml", "calc_agent/config.toml"]
)
def test_the_example_run_files_check(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    if name.startswith("calc_agent"):
        pytest.importorskip("autogen_agentchat")
    assert main(["train", str(EXAMPLES / name), "--check"]) == 0
    out = capsys.readouterr().out
    resolved = json.loads(out[out.index("{") :])
    assert resolved["run_dir"].startswith("runs/")


@pytest.mark.parametrize("name", ["grpo", "rloo", "ppo", "sft", "dpo", "apo"])
def test_every_builtin_algorithm_builds_its_config_from_a_file(tmp_path: Path, name: str) -> None:
    plan = load_run_file(_write(tmp_path, BASE.replace('"grpo"', f'"{name}"').replace("steps = 2", "")))
    assert plan.entry.name == name and type(plan.config) is plan.entry.config_class()
    assert plan.config.model == "tiny"


# --- session: a context manager around the warm start and fit ----------------------------------
# A recording test double of an algorithm (the run file is the layer under test, not training): its
# fit runs the agent once per training task, on the event loop it is given.
EVENTS: list[str] = []


@dataclasses.dataclass
class RecordingConfig:
    model: str = "tiny"
    run_dir: str = "runs/latest"
    seed: int = 0


class RecordingAlgorithm:
    """Test double: ``fit`` runs the agent on each training task and records it (no model, no training)."""

    def __init__(self, config: RecordingConfig, *, trainable: list[str] | None = None) -> None:
        self.config = config

    def fit(self, agent: Any, train_tasks: Any, val_tasks: Any = ()) -> TrainResult:
        EVENTS.append("fit")
        return asyncio.run(self._run(agent, train_tasks))

    async def fit_async(self, agent: Any, train_tasks: Any, val_tasks: Any = ()) -> TrainResult:
        EVENTS.append("fit_async")
        return await self._run(agent, train_tasks)

    async def _run(self, agent: Any, train_tasks: Any) -> TrainResult:
        rewards = [await agent(t.input, None) for t in train_tasks]
        return TrainResult(Path(self.config.run_dir), None, None, [{"train/reward_mean": sum(rewards)}])


class SyncOnlyAlgorithm:
    """Test double: an algorithm with ``fit`` only."""

    def __init__(self, config: RecordingConfig) -> None:
        self.config = config

    def fit(self, agent: Any, train_tasks: Any, val_tasks: Any = ()) -> TrainResult:
        raise AssertionError("never reached: an async session is refused first")


def _double_module() -> types.ModuleType:
    module = types.ModuleType("run_file_session_double")
    state: dict[str, Any] = {"loop": None, "client": None}

    @contextlib.contextmanager
    def sync_session(trainable: list[str] | None, label: str = "sync") -> Generator[None]:
        EVENTS.append(f"enter {label} trainable={trainable}")
        try:
            yield
        finally:
            EVENTS.append(f"exit {label}")

    @contextlib.asynccontextmanager
    async def async_session(config: RecordingConfig) -> AsyncGenerator[None]:
        state["loop"] = asyncio.get_running_loop()
        state["client"] = "open"
        EVENTS.append(f"enter async run_dir={Path(config.run_dir).name}")
        try:
            yield
        finally:
            state["client"] = None
            EVENTS.append("exit async")

    async def agent(task: Any, llm: Any) -> float:
        loop = asyncio.get_running_loop()
        same_loop = state["loop"] is None or state["loop"] is loop
        EVENTS.append(f"agent client={state['client']} same_loop={same_loop}")
        return 1.0

    def warm_start(model: str, out_dir: Path, tasks: Any, seed: int) -> Path:
        EVENTS.append(f"warm_start in_loop={_has_running_loop()}")
        out_dir.mkdir(parents=True, exist_ok=True)
        return out_dir

    module.sync_session = sync_session  # type: ignore[attr-defined]
    module.async_session = async_session  # type: ignore[attr-defined]
    module.agent = agent  # type: ignore[attr-defined]
    module.warm_start = warm_start  # type: ignore[attr-defined]
    module.not_a_context_manager = lambda: 42  # type: ignore[attr-defined]
    module.RecordingAlgorithm = RecordingAlgorithm  # type: ignore[attr-defined]
    module.SyncOnlyAlgorithm = SyncOnlyAlgorithm  # type: ignore[attr-defined]
    return module


def _has_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


SESSION_BASE = """
agent = "run_file_session_double:agent"
train_tasks = "train.jsonl"
warm_start = "run_file_session_double:warm_start"
trainable = ["solver"]
[algorithm]
name = "recording-double"
"""


@pytest.fixture
def session_double(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from lightning_rl.algorithms import base

    monkeypatch.setitem(sys.modules, "run_file_session_double", _double_module())
    for name, cls in (("recording-double", "RecordingAlgorithm"), ("sync-only-double", "SyncOnlyAlgorithm")):
        entry = base.AlgorithmEntry(name, f"run_file_session_double:{cls}", "test double")
        monkeypatch.setitem(base._REGISTRY, name, entry)  # pyright: ignore[reportPrivateUsage]
    EVENTS.clear()
    yield
    EVENTS.clear()


def test_a_sync_session_is_entered_around_the_warm_start_and_fit(tmp_path: Path, session_double: None) -> None:
    body = SESSION_BASE + f'run_dir = "{tmp_path / "run"}"\n'
    body = 'session = { function = "run_file_session_double:sync_session", label = "S" }\n' + body
    result = run_plan(load_run_file(_write(tmp_path, body)))
    assert EVENTS == [
        "enter S trainable=['solver']",  # the run file's roles reach the plugin call
        "warm_start in_loop=False",
        "fit",
        "agent client=None same_loop=True",
        "agent client=None same_loop=True",
        "exit S",
    ]
    assert result.history == [{"train/reward_mean": 2.0}]


def test_an_async_session_shares_the_training_event_loop(tmp_path: Path, session_double: None) -> None:
    body = 'session = "run_file_session_double:async_session"\n' + SESSION_BASE
    run_plan(load_run_file(_write(tmp_path, body), [f"run_dir={tmp_path / 'run'}"]))
    assert EVENTS == [
        "enter async run_dir=run",
        "warm_start in_loop=False",  # in a worker thread: a warm start may run its own event loop
        "fit_async",
        # the agent sees what the session opened, on the loop the session was entered in
        "agent client=open same_loop=True",
        "agent client=open same_loop=True",
        "exit async",
    ]


def test_a_session_must_return_a_context_manager(tmp_path: Path, session_double: None) -> None:
    body = 'session = "run_file_session_double:not_a_context_manager"\n' + SESSION_BASE
    with pytest.raises(ConfigError, match=r"session: run_file_session_double:not_a_context_manager returned int"):
        run_plan(load_run_file(_write(tmp_path, body), [f"run_dir={tmp_path / 'run'}"]))


def test_an_async_session_needs_an_algorithm_with_fit_async(tmp_path: Path, session_double: None) -> None:
    body = 'session = "run_file_session_double:async_session"\n' + SESSION_BASE.replace("recording", "sync-only")
    body = body.replace('trainable = ["solver"]\n', "")
    with pytest.raises(ConfigError, match=r"algorithm 'sync-only-double' has no fit_async .* give a sync context"):
        run_plan(load_run_file(_write(tmp_path, body), [f"run_dir={tmp_path / 'run'}"]))
    assert "fit" not in EVENTS


@pytest.mark.parametrize(
    ("session", "message"),
    [
        ('"no_such_module:session"', r"session: cannot import 'no_such_module'"),
        ('"run_file_session_double:nope"', r"session: module run_file_session_double has no 'nope'"),
        ('"session_without_colon"', r"session: 'session_without_colon' is not module:function"),
        ("{ label = 'x' }", r"session: a table needs function = 'module:function'"),
        (
            '{ function = "run_file_session_double:sync_session", lable = "x" }',
            r"session\.lable: unknown key; did you mean 'label'\?",
        ),
    ],
)
def test_bad_sessions_name_the_key_and_the_fix(
    tmp_path: Path, session_double: None, session: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_run_file(_write(tmp_path, f"session = {session}\n" + SESSION_BASE))


def test_function_tables_bind_arguments_that_set_can_reach(tmp_path: Path, session_double: None) -> None:
    body = 'session = { function = "run_file_session_double:sync_session", label = "A" }\n' + SESSION_BASE
    plan = load_run_file(_write(tmp_path, body), ["session.label=B", f"run_dir={tmp_path / 'run'}"])
    run_plan(plan)
    assert EVENTS[0] == "enter B trainable=['solver']" and EVENTS[-1] == "exit B"
