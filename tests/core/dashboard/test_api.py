"""The dashboard's JSON API over HTTP (real server on loopback) and its rollout index on a real SQLite store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from lightning_rl.dashboard.app import read_metrics
from lightning_rl.dashboard.index import RolloutFilter, RolloutIndex
from lightning_rl.dashboard.serve import running_dashboard, store_label
from lightning_rl.errors import InvalidRequestError
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.types import AttemptStatus, RolloutRequest, Task


async def _indexed(http: httpx.AsyncClient, *, timeout_s: float) -> dict[str, Any]:
    """``/api/info`` once the dashboard's background reader has indexed every rollout's spans."""
    deadline = time.monotonic() + timeout_s
    while True:
        info: dict[str, Any] = (await http.get("/api/info")).json()
        if info["span_progress"]["indexed"] == info["rollouts"]:
            return info
        assert time.monotonic() < deadline, f"spans not indexed after {timeout_s} s: {info['span_progress']}"
        await asyncio.sleep(0.05)


async def test_filters_and_paging_over_a_training_run(trained_run: Path) -> None:
    async with running_dashboard(str(trained_run / "store.sqlite")) as url, httpx.AsyncClient(base_url=url) as http:
        everything = (await http.get("/api/rollouts", params={"limit": 500})).json()
        rows = everything["rows"]
        assert everything["total"] == len(rows) > 0
        assert [r["seq"] for r in rows] == sorted((r["seq"] for r in rows), reverse=True)  # newest first

        val = (await http.get("/api/rollouts", params={"mode": "val"})).json()
        assert val["total"] == sum(r["mode"] == "val" for r in rows) > 0
        assert {r["mode"] for r in val["rows"]} == {"val"}

        ok = (await http.get("/api/rollouts", params={"status": "succeeded,failed"})).json()
        assert ok["total"] == sum(r["status"] in ("succeeded", "failed") for r in rows)

        rewarded = (await http.get("/api/rollouts", params={"reward_min": 0.5, "reward_max": 1})).json()
        assert rewarded["total"] == sum(r["reward"] is not None and 0.5 <= r["reward"] <= 1 for r in rows)
        assert all(0.5 <= r["reward"] <= 1 for r in rewarded["rows"])

        two = (await http.get("/api/rollouts", params={"limit": 2, "offset": 2})).json()
        assert [r["id"] for r in two["rows"]] == [r["id"] for r in rows[2:4]]

        one = rows[-1]["id"]
        found = (await http.get("/api/rollouts", params={"q": one.upper()})).json()
        assert [r["id"] for r in found["rows"]] == [one]

        # span-derived filters, once the background reader has caught up (it used to count a rollout
        # whose spans were still being read, which this test met as roles=None on CI, 2026-11-27)
        info = await _indexed(http, timeout_s=120.0)
        full = (await http.get("/api/rollouts", params={"limit": 500})).json()["rows"]
        writer = (await http.get("/api/rollouts", params={"role": "writer", "limit": 500})).json()
        assert writer["total"] == sum("writer" in r["roles"] for r in full) > 0
        assert (await http.get("/api/rollouts", params={"role": "nobody"})).json()["total"] == 0
        version = full[0]["model_versions"][0]
        by_version = (await http.get("/api/rollouts", params={"model_version": version, "limit": 500})).json()
        assert by_version["total"] == sum(version in r["model_versions"] for r in full) > 0

        # the credit settings came from the run's config.json
        assert info["settings"]["air"] == {"tool_error": -0.1}

        # curves from metrics.jsonl
        curves = (await http.get("/api/curves")).json()
        reward = next(s for s in curves["series"] if s["key"] == "train/reward_mean")
        assert [p[0] for p in reward["points"]] == [1.0, 2.0]


async def test_bad_requests_get_clear_errors(trained_run: Path) -> None:
    async with running_dashboard(str(trained_run / "store.sqlite")) as url, httpx.AsyncClient(base_url=url) as http:
        r = await http.get("/api/rollouts", params={"reward_min": 1, "reward_max": 0})
        assert r.status_code == 400 and "swap them" in r.json()["detail"]
        r = await http.get("/api/rollouts", params={"status": "finished"})
        assert r.status_code == 400 and "succeeded" in r.json()["detail"]
        r = await http.get("/api/rollouts", params={"limit": 100_000})
        assert r.status_code == 400 and "limit" in r.json()["detail"]
        r = await http.get("/api/rollouts", params={"reward_min": "high"})
        assert r.status_code == 422
        r = await http.get("/api/rollouts/no-such-rollout")
        assert r.status_code == 404 and "does not exist" in r.json()["detail"]


async def test_a_token_guards_the_api_but_not_the_page(trained_run: Path) -> None:
    store = str(trained_run / "store.sqlite")
    async with running_dashboard(store, token="s3cret") as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/api/rollouts")).status_code == 401
        assert (await http.get("/api/rollouts", headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await http.get("/api/rollouts", headers={"Authorization": "Bearer s3cret"})).status_code == 200
        page = await http.get("/")
        assert page.status_code == 200 and "app.js" in page.text  # the page holds no data


def test_binding_off_loopback_without_a_token_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_rl.cli",
            "dashboard",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--host",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--token" in proc.stderr


def test_store_label_hides_passwords() -> None:
    assert store_label("postgresql://u:pw@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert store_label("runs/demo/store.sqlite") == "runs/demo/store.sqlite"


def test_metrics_are_read_incrementally_and_a_half_written_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "train/reward_mean": 0.5}) + "\n" + '{"step": 2, "train/rew')
    offset, rows = read_metrics(path)
    assert rows == [{"step": 1.0, "train/reward_mean": 0.5}]
    with path.open("a") as fh:
        fh.write('ard_mean": NaN}\n')
    offset, rows = read_metrics(path, offset)
    assert rows == [{"step": 2.0, "train/reward_mean": None}]  # NaN is not JSON: None
    assert read_metrics(path, offset) == (offset, [])


async def test_the_index_follows_new_and_ending_rollouts_and_a_prune(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.sqlite")
    try:
        await store.enqueue([RolloutRequest(id=f"r{i}", task=Task(input={"q": f"question {i}"})) for i in range(3)])
        index = RolloutIndex(store, min_refresh_s=0.0)
        page = await index.page(RolloutFilter())
        assert [r.id for r in page.rows] == ["r2", "r1", "r0"] and page.total == 3

        claims = await store.claim("w", n=2)
        await store.finish_attempt(claims[0].attempt.id, AttemptStatus.SUCCEEDED, reward=0.75)
        await store.finish_attempt(claims[1].attempt.id, AttemptStatus.FAILED, error="agent bug: KeyError")
        await store.enqueue([RolloutRequest(id="r3", task=Task(input={"q": "question 3"}))])
        page = await index.page(RolloutFilter(status=frozenset({"succeeded"})))
        assert [(r.id, r.reward) for r in page.rows] == [("r0", 0.75)]
        assert [r.id for r in (await index.page(RolloutFilter(q="keyerror"))).rows] == ["r1"]
        assert (await index.page(RolloutFilter())).total == 4

        await store.prune(older_than=1e12)  # deletes the two ended rollouts: positions shift
        page = await index.page(RolloutFilter())
        assert [r.id for r in page.rows] == ["r3", "r2"]
    finally:
        await store.close()


async def test_the_history_loads_in_the_background_newest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The web page's index reads the newest chunk at once and the rest backwards, in the background."""
    import lightning_rl.dashboard.index as index_module

    monkeypatch.setattr(index_module, "HISTORY_CHUNK", 4)
    store = SQLiteStore(tmp_path / "store.sqlite")
    try:
        await store.enqueue([RolloutRequest(id=f"r{i:02d}", task=Task(input={"q": i})) for i in range(10)])
        for claim in await store.claim("w", n=10):
            await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=0.5)
        index = RolloutIndex(store, min_refresh_s=0.0, history_in_background=True)
        page = await index.page(RolloutFilter(), limit=3)
        assert [r.id for r in page.rows] == ["r09", "r08", "r07"]
        assert page.total == 4 and not page.history_complete  # only the newest chunk so far

        await store.enqueue([RolloutRequest(id="r10", task=Task(input={"q": 10}))])  # arrives meanwhile
        index.start_span_indexing()
        for _ in range(200):
            if index.history_complete and index.indexed == 10:
                break
            await asyncio.sleep(0.02)
        page = await index.page(RolloutFilter(), limit=20)
        assert page.history_complete
        assert [r.id for r in page.rows] == [f"r{i:02d}" for i in range(10, -1, -1)]  # each once, in order
        assert page.indexed == 10 and page.known == 11  # r10 is still queued: not ended, no spans to read
        await index.close()
    finally:
        await store.close()


async def test_a_rollout_counts_as_indexed_only_once_its_spans_are_summarised(tmp_path: Path) -> None:
    """``indexed`` is what clients wait on before filtering by role: a rollout whose spans are still
    being read must not count (it did, and a role filter then met ``roles=None``; CI, 2026-11-27)."""
    store = SQLiteStore(tmp_path / "store.sqlite")
    release = asyncio.Event()
    reading = asyncio.Event()
    real_query_spans = store.query_spans

    async def slow_query_spans(**kwargs: Any) -> Any:  # the real store, held until the test says go
        reading.set()
        await release.wait()
        return await real_query_spans(**kwargs)

    try:
        await store.enqueue([RolloutRequest(id="r0", task=Task(input={"q": 0}))])
        (claim,) = await store.claim("w", n=1)
        await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
        store.query_spans = slow_query_spans  # type: ignore[method-assign]
        index = RolloutIndex(store, min_refresh_s=0.0)
        await index.refresh(force=True)
        index.start_span_indexing()
        await asyncio.wait_for(reading.wait(), 10)
        assert index.indexed == 0 and index.get("r0") is not None  # out of the queue, not summarised yet
        release.set()
        for _ in range(500):
            if index.indexed == 1:
                break
            await asyncio.sleep(0.01)
        row = index.get("r0")
        assert index.indexed == 1 and row is not None and row.roles is not None
        await index.close()
    finally:
        await store.close()


def test_bad_filters_say_what_to_do() -> None:
    with pytest.raises(InvalidRequestError, match="use any of"):
        RolloutFilter(status=frozenset({"done"}))
    with pytest.raises(InvalidRequestError, match="train, val or test"):
        RolloutFilter(mode="eval")


def test_the_page_ships_in_the_package_and_loads_nothing_from_elsewhere() -> None:
    from lightning_rl.dashboard.app import static_dir

    files = {p.name: p.read_text() for p in static_dir().iterdir()}
    assert {"index.html", "app.js", "app.css"} <= set(files)
    for name, text in files.items():
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text, name
