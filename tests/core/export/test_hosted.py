"""``HostedSFT`` over real HTTP against the fake fine-tuning API, in every job state."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lightning_rl.export import HostedFineTuningError, HostedSFT, HostedSFTConfig, Selection
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.testing import FAKE_API_KEY, FakeFineTuningServer
from lightning_rl.types import LLMResource

FAST: dict[str, Any] = {"poll_initial_s": 0.01, "poll_max_s": 0.05}


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_API_KEY)


def run_hosted(
    store_path: Path, api: FakeFineTuningServer | FakeFineTuningServerAt, seen: list[str] | None = None, **config: Any
) -> tuple[Any, list[Any]]:
    """Run HostedSFT on the store (after publishing a first resources version); return the job and the versions."""

    async def go() -> tuple[Any, list[Any]]:
        store = SQLiteStore(store_path)
        try:
            await store.add_resources(
                llm=LLMResource(base_url="http://gateway/v1", model="base", sampling={"temperature": 0.7}),
                prompts={"system": "be brief"},
            )
            sft = HostedSFT(
                HostedSFTConfig(base_url=api.base_url, model="gpt-test", **{**FAST, **config}),
                on_status=None if seen is None else (lambda status, _job, seen=seen: seen.append(status)),
            )
            try:
                job = await sft.fit_async(store, Selection(min_reward=1.0))
            finally:
                versions = [await store.get_resources(v) for v in range(1, (await store.get_resources()).version + 1)]
            return job, versions
        finally:
            await store.close()

    return asyncio.run(go())


def test_a_succeeded_job_publishes_the_fine_tuned_model_for_the_next_rollouts(store_path: Path) -> None:
    seen: list[str] = []
    with FakeFineTuningServer(outcome="succeeded") as api:
        job, versions = run_hosted(store_path, api, seen, suffix="calc", n_epochs=2)
        [uploaded] = api.files.values()
        [created] = api.jobs.values()
    assert seen == ["validating_files", "queued", "running", "succeeded"]
    assert job.status == "succeeded" and job.statuses == seen
    assert job.fine_tuned_model == created["fine_tuned_model"] and job.fine_tuned_model.startswith("ft:gpt-test:")
    assert created["model"] == "gpt-test" and created["suffix"] == "calc"
    assert created["method"]["supervised"]["hyperparameters"] == {"n_epochs": 2}
    lines = [json.loads(line) for line in uploaded.decode().splitlines()]
    assert len(lines) == job.export.records == 48 and all("messages" in line for line in lines)
    # the new version names the fine-tuned model and keeps what the previous one set
    old, new = versions
    assert new.llm is not None and new.llm.model == job.fine_tuned_model and job.resources.version == new.version
    assert (
        new.llm.base_url == api.base_url
        and new.llm.sampling == {"temperature": 0.7}
        and new.llm.api_key != FAKE_API_KEY
    )
    assert new.prompts == old.prompts and new.extra["fine_tuning_job"] == job.id


def test_a_failed_job_raises_with_the_apis_reason(store_path: Path) -> None:
    error = {"code": "invalid_training_file", "message": "line 7: messages must end with an assistant turn"}
    with FakeFineTuningServer(outcome="failed", error=error) as api:
        with pytest.raises(HostedFineTuningError) as err:
            run_hosted(store_path, api)
    assert err.value.status == "failed" and err.value.job_id in api.jobs
    assert str(err.value).endswith("failed (invalid_training_file): line 7: messages must end with an assistant turn")


def test_a_job_cancelled_by_the_provider_is_an_error_and_publishes_nothing(store_path: Path) -> None:
    with FakeFineTuningServer(outcome="cancelled") as api:
        with pytest.raises(HostedFineTuningError, match="was cancelled"):
            run_hosted(store_path, api)
    assert not api.cancelled.is_set(), "this run did not ask for the cancellation"


def test_an_api_error_is_quoted(store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    with FakeFineTuningServer() as api:
        with pytest.raises(
            HostedFineTuningError, match=r"POST /files\) failed: HTTP 401 \(invalid_api_key\): Incorrect"
        ):
            run_hosted(store_path, api)
    assert api.jobs == {}


def test_a_missing_key_or_an_empty_selection_fails_before_any_request(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeFineTuningServer() as api:
        monkeypatch.delenv("OPENAI_API_KEY")
        with pytest.raises(PermissionError, match="set OPENAI_API_KEY"):
            run_hosted(store_path, api)
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_API_KEY)

        async def empty() -> None:
            store = SQLiteStore(store_path)
            try:
                await HostedSFT(HostedSFTConfig(base_url=api.base_url, model="m")).fit_async(
                    store, Selection(min_reward=5.0)
                )
            finally:
                await store.close()

        with pytest.raises(ValueError, match="kept no example"):
            asyncio.run(empty())
    assert api.requests == []


def test_a_timeout_cancels_the_job(store_path: Path) -> None:
    with FakeFineTuningServer(outcome="hang") as api:
        with pytest.raises(HostedFineTuningError, match="did not end within"):
            run_hosted(store_path, api, timeout_s=0.3)
        assert api.cancelled.is_set() and next(iter(api.jobs.values()))["status"] == "cancelled"


def _interruptible() -> None:
    """Run in the child before it starts the CLI: SIGINT back to its default action. A shell without
    job control starts a command sent to the background (``cmd &``, as CI scripts and ``nohup`` do)
    with SIGINT ignored; a child inherits that, and Python then leaves it ignored, so the CLI would
    never see the Ctrl-C this test sends (the test hung for 60 s whenever pytest ran in the background)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_cancels_the_running_job(store_path: Path, tmp_path: Path) -> None:
    """The CLI in a child process gets SIGINT while the job runs: it cancels the job and exits 130."""
    with FakeFineTuningServer(outcome="hang") as api:
        env = {**os.environ, "OPENAI_API_KEY": FAKE_API_KEY}
        argv = [sys.executable, "-m", "lightning_rl.cli", "export", "sft", "--store", str(store_path)]
        argv += ["--hosted", api.base_url, "--base-model", "gpt-test", "--poll-max", "2"]
        # the context manager closes the pipes whatever happens (a leaked pipe fails a later test
        # with a ResourceWarning when the garbage collector finds it)
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        with subprocess.Popen(argv, env=env, preexec_fn=_interruptible, **pipes) as child:
            try:
                assert api.running.wait(60), "the job never reached running"
                child.send_signal(signal.SIGINT)
                out, err = child.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                out, err = child.communicate()
                pytest.fail(f"the CLI did not exit within 60 s of SIGINT; its output:\n{out}\n{err}")
            finally:
                child.kill()
        assert child.returncode == 130, err
        assert api.cancelled.is_set() and next(iter(api.jobs.values()))["status"] == "cancelled"
        assert out.rstrip().endswith(": cancelled"), out


def test_the_cli_prints_the_apis_reason_on_one_line(store_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_rl.cli import main

    error = {"code": "quota_exceeded", "message": "You have reached your fine-tuning quota."}
    with FakeFineTuningServer(outcome="failed", error=error, states=("queued",)) as api:
        argv = ["export", "sft", "--store", str(store_path), "--hosted", api.base_url, "--base-model", "gpt-test"]
        assert main(argv) == 1
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert line.startswith("lightning-rl: error: fine-tuning job ftjob-")
    assert line.endswith("failed (quota_exceeded): You have reached your fine-tuning quota.")
    assert ": queued" in captured.out


def test_an_unreachable_api_is_one_clear_error(store_path: Path) -> None:
    with FakeFineTuningServer() as api:
        url = api.base_url  # the port is closed once the fake stops
    with pytest.raises(HostedFineTuningError, match="could not reach the fine-tuning API at http://127.0.0.1:"):
        run_hosted(store_path, FakeFineTuningServerAt(url))


class FakeFineTuningServerAt:
    """Only the ``base_url`` of a stopped fake (what ``run_hosted`` reads)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
