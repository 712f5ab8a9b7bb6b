"""A store filled by a real short training run (tiny model, real gateway and runner), shared by the
dashboard tests: built once per session, read-only afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("fastapi")


def train_small_run(run_dir: Path) -> Path:
    """Two GRPO steps of the two-role agent with an AIR policy; returns the run folder."""
    from lightning_rl.backends.torch_backend import TorchBackendConfig
    from lightning_rl.engine.tiny import default_tiny_model
    from lightning_rl.trainer import Trainer, TrainerConfig
    from lightning_rl.types import Task

    from .run_agent import two_role_agent

    cfg = TrainerConfig(
        model=str(default_tiny_model()),
        run_dir=str(run_dir),
        steps=2,
        batch_size=2,
        group_size=3,
        max_tokens=8,
        val_every=0,
        tensorboard=False,
        progress=False,
        rollout_timeout_s=60,
        air={"tool_error": -0.1},
        backend=TorchBackendConfig(lr=1e-2, old_logprobs="sampled"),
    )
    tasks = [Task(input={"q": f"say something about {w}"}) for w in ("cats", "dogs", "rain")]
    # The openai client imports many modules on first use; on a loaded machine that alone can pass the
    # runner's blocked-loop watchdog inside the first rollouts (which it then interrupts): import them now.
    import openai

    warm = openai.AsyncOpenAI(api_key="warm-up", base_url="http://127.0.0.1:9/v1")
    _ = (warm.chat.completions, warm.responses, warm.beta, warm.completions)
    asyncio.run(warm.close())
    Trainer(cfg).fit(two_role_agent, tasks, val_tasks=tasks[:2])
    return run_dir


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_small_run(tmp_path_factory.mktemp("dashboard") / "run")


def find_chromium() -> str:
    """Debian's chromium (``.ci/run`` installs it); fails under CI when missing, skips elsewhere."""
    path = os.environ.get("LIGHTNING_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    message = "no chromium executable: apt-get install -y chromium (or set LIGHTNING_CHROMIUM)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def chromium() -> str:
    pytest.importorskip("playwright")
    return find_chromium()


@contextlib.contextmanager
def dashboard_in_thread(store_url: str, **kwargs: Any) -> Iterator[str]:
    """Serve the dashboard on loopback from a thread (the browser tests are synchronous); yield its URL."""
    from lightning_rl.dashboard.serve import running_dashboard

    ready: queue.Queue[str | BaseException] = queue.Queue()
    stop = threading.Event()

    async def main() -> None:
        try:
            async with running_dashboard(store_url, poll_s=0.5, **kwargs) as url:
                ready.put(url)
                while not stop.is_set():
                    await asyncio.sleep(0.05)
        except BaseException as exc:  # hand it to the test instead of dying silently in the thread
            ready.put(exc)

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    got = ready.get(timeout=60)
    if isinstance(got, BaseException):
        raise got
    try:
        yield got
    finally:
        stop.set()
        thread.join(timeout=30)
