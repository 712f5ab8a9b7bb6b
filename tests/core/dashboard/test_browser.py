"""The dashboard in a real browser (Debian's chromium driven by playwright) on a real training run's store.

The expected rewards and advantages come from the trainer's own path (``collect_samples`` then
``compute_advantages``) run here on the same store, so the page is checked against what training did.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from lightning_rl.credit import compute_advantages
from lightning_rl.dashboard.app import read_metrics
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.trainer.loop import collect_samples
from lightning_rl.types import Rollout

from .conftest import dashboard_in_thread

playwright_sync = pytest.importorskip("playwright.sync_api")


def _expected(run: Path) -> tuple[list[Rollout], Rollout, dict[str, Any]]:
    """All rollouts, one train rollout, and its writer transition as the trainer computed it."""
    air = json.loads((run / "config.json").read_text())["air"]

    async def go() -> tuple[list[Rollout], Rollout, dict[str, Any]]:
        store = SQLiteStore(run / "store.sqlite")
        try:
            rollouts = await store.query_rollouts(limit=1000)
            # a train rollout that succeeded (on a loaded machine the runner's watchdog may fail one)
            chosen = next(r for r in rollouts if r.mode == "train" and r.status.value == "succeeded")
            group = await store.query_rollouts(group_id=chosen.group_id, limit=100)
            collected = await collect_samples(store, group, trainable=None, air=air)
            transitions = compute_advantages(collected.samples)
            mine = [t for t in transitions if t.rollout_id == chosen.id]
            assert len(mine) == 1 and mine[0].role == "writer"  # the critic is frozen
            t = mine[0]
            return rollouts, chosen, {"span_id": t.span_id, "air": t.reward, "advantage": t.advantage}
        finally:
            await store.close()

    return asyncio.run(go())


def test_the_page_lists_rollouts_and_shows_spans_and_credited_transitions(trained_run: Path, chromium: str) -> None:
    rollouts, chosen, expected = _expected(trained_run)
    problems: list[str] = []
    with dashboard_in_thread(str(trained_run / "store.sqlite")) as url, playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))

            # the list: every rollout of the run, newest first
            page.goto(url + "/")
            page.wait_for_selector("[data-testid=rollout-row]")
            rows = page.locator("[data-testid=rollout-row]")
            assert rows.count() == len(rollouts)
            assert page.get_by_test_id("page-info").inner_text().endswith(f"of {len(rollouts)} matching")
            assert rows.first.get_attribute("data-id") == max(rollouts, key=lambda r: r.seq).id

            # a filter: validation rollouts only
            page.get_by_test_id("filter-mode").select_option("val")
            page.get_by_test_id("apply").click()
            page.wait_for_function(
                "n => document.querySelectorAll('[data-testid=rollout-row]').length === n",
                arg=sum(r.mode == "val" for r in rollouts),
            )

            # one rollout: spans on the timeline, both calls, the transitions with the trainer's numbers
            page.goto(f"{url}/#/rollout/{chosen.id}")
            page.wait_for_selector("[data-testid=transition]")
            span_names = page.locator("[data-testid=span]").evaluate_all("els => els.map(e => e.dataset.name)")
            assert span_names.count("llm.call") == 2 and "lightning.rollout" in span_names
            assert page.locator("[data-testid=call]").count() == 2
            assert page.get_by_test_id("final-reward").inner_text() == f"{chosen.final_reward:.3f}"
            cards = page.locator("[data-testid=transition]")
            assert cards.count() == 1  # the critic's call is shown as not trained
            assert cards.first.get_attribute("data-span") == expected["span_id"]
            assert cards.first.get_by_test_id("air").inner_text() == f"{expected['air']:.3f}"
            assert cards.first.get_by_test_id("advantage").inner_text() == f"{expected['advantage']:.3f}"
            assert page.locator("[data-testid=frozen-call]").count() == 1

            # the curves of the run folder
            page.goto(f"{url}/#/curves")
            # "attached", not "visible": a run whose reward stayed flat draws a horizontal line, whose
            # bounding box has zero height, and Playwright counts a zero-height box as hidden
            curve = "[data-testid=chart][data-key='train/reward_mean'] polyline"
            line = page.wait_for_selector(curve, state="attached")
            assert line is not None
            _, rows = read_metrics(trained_run / "metrics.jsonl")
            steps = [r for r in rows if r.get("train/reward_mean") is not None and r.get("step") is not None]
            assert len((line.get_attribute("points") or "").split()) == len(steps) > 0
            assert page.locator("[data-testid=chart]").count() >= 5

            # an unknown rollout says so on the page (and is not a console error of ours)
            page.goto(f"{url}/#/rollout/no-such-rollout")
            page.wait_for_selector("[data-testid=error]")
            assert "does not exist" in page.get_by_test_id("error").inner_text()
            # the browser reports the failed fetch's 404 itself; only that one is expected
            problems = [p for p in problems if "404" not in p]
        finally:
            browser.close()
    assert problems == []
