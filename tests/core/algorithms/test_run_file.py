"""``lightning-rl train``'s run file: parsed, overridden and checked before anything starts.

Each bad file must fail with a message that names the key and the fix; nothing here trains.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from lightning_rl.cli import main  # noqa: E402
from lightning_rl.trainer.run_file import ConfigError, load_run_file  # noqa: E402

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
