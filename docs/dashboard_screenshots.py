"""Take the dashboard screenshots in docs/ from a run folder (Debian's chromium via playwright).

    uv run python docs/dashboard_screenshots.py RUN_DIR [--chromium /usr/bin/chromium]

RUN_DIR is a trainer's run folder (``store.sqlite``, ``config.json``, ``metrics.jsonl``); the
screenshots in docs/ were taken on the two-step run of ``tests/core/dashboard/conftest.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import threading
from pathlib import Path

from playwright.sync_api import sync_playwright

from lightning_rl.dashboard.serve import running_dashboard

DOCS = Path(__file__).parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = p.parse_args()
    urls: list[str] = []
    stop = threading.Event()

    async def serve() -> None:
        async with running_dashboard(str(args.run_dir / "store.sqlite")) as url:
            urls.append(url)
            while not stop.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    while not urls:
        threading.Event().wait(0.05)
    url = urls[0]
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium)
            page = browser.new_page(viewport={"width": 1280, "height": 760})
            page.goto(url + "/")
            page.wait_for_selector("[data-testid=rollout-row]")
            page.screenshot(path=DOCS / "dashboard-rollouts.png")
            first_train = page.locator("[data-testid=rollout-row]", has_text="train").last
            first_train.click()
            page.wait_for_selector("[data-testid=transition]")
            page.screenshot(path=DOCS / "dashboard-rollout.png", full_page=True)
            page.goto(url + "/#/curves")
            page.wait_for_selector("[data-testid=chart] polyline")
            page.screenshot(path=DOCS / "dashboard-curves.png")
            browser.close()
    finally:
        stop.set()
        thread.join(timeout=30)


if __name__ == "__main__":
    main()
