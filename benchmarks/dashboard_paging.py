"""Dashboard paging on a large store: is a page of the rollouts list served in <= 200 ms at 100k rollouts?

Fills a SQLite store through the public store API with ``--rollouts`` finished rollouts (each with
one ``llm.call`` span carrying a role, a model version, token ids and response text, as the
gateway writes them; 10% failed, a tenth of them validation rollouts), starts
``lightning-rl dashboard`` on it in a separate process (as a user would), and times page requests
over HTTP from this process: the first page, a deep page, every filter of the list, and the
span-derived filters (role, model version) once the dashboard's background span reader finished.
Also reported: how long the dashboard took to answer its first page (it reads the newest rollouts
first), to read every older rollout in the background, and to read every rollout's spans.

    uv run python benchmarks/dashboard_paging.py                 # 100k rollouts (about 3 min to fill)
    uv run python benchmarks/dashboard_paging.py --rollouts 2000 # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from lightning_rl import semconv
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.types import AttemptStatus, RolloutConfig, RolloutRequest, Span, Task

__all__ = ["main"]

BATCH = 5_000


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rollouts", type=int, default=100_000, help="Rollouts in the store.")
    p.add_argument("--repeats", type=int, default=20, help="Requests per measured query (p50/p95/max reported).")
    p.add_argument("--store", default=None, help="Reuse (or create) this SQLite file instead of a temporary one.")
    return p.parse_args(argv)


async def fill(path: Path, n: int) -> float:
    """Enqueue, claim, add one llm.call span to, and finish ``n`` rollouts; returns seconds taken."""
    started = time.perf_counter()
    store = SQLiteStore(path)
    try:
        have = (await store.stats()).rollouts_by_status
        if sum(have.values()) >= n:
            return 0.0
        for lo in range(0, n, BATCH):
            hi = min(n, lo + BATCH)
            await store.enqueue(
                [
                    RolloutRequest(
                        id=f"bench-{i:06d}",
                        task=Task(
                            input={"question": f"What is {i} times 7?", "answer": str(7 * i)}, id=f"task-{i % 500}"
                        ),
                        group_id=f"g{i // 8}",
                        mode="val" if i % 10 == 9 else "train",
                        config=RolloutConfig(timeout_s=86_400, heartbeat_timeout_s=86_400),  # filling takes minutes
                    )
                    for i in range(lo, hi)
                ]
            )
            claims = await store.claim("bench-worker", n=hi - lo)
            spans = [
                Span(
                    name=semconv.SPAN_LLM_CALL,
                    rollout_id=c.rollout.id,
                    attempt_id=c.attempt.id,
                    attributes={
                        semconv.ROLE: "solver" if j % 3 else "planner",
                        semconv.MODEL_VERSION: (lo + j) // 2_000,
                        semconv.PROMPT_TOKEN_IDS: list(range(40)),
                        semconv.RESPONSE_TOKEN_IDS: list(range(12)),
                        semconv.RESPONSE_TEXT: f"The answer is {7 * (lo + j)}.",
                        semconv.TOOL_CALLS: "[]",
                    },
                )
                for j, c in enumerate(claims)
            ]
            await store.add_spans(spans)
            # concurrent finishes: the SQLite store commits a group of them per transaction (one fsync)
            await asyncio.gather(
                *(
                    store.finish_attempt(c.attempt.id, AttemptStatus.FAILED, error=f"agent bug {lo + j}")
                    if (lo + j) % 10 == 3
                    else store.finish_attempt(c.attempt.id, AttemptStatus.SUCCEEDED, reward=((lo + j) % 5) / 4)
                    for j, c in enumerate(claims)
                )
            )
            print(f"  filled {hi}/{n}", file=sys.stderr, flush=True)
    finally:
        await store.close()
    return time.perf_counter() - started


def start_dashboard(path: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lightning_rl.cli", "dashboard", "--store", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if " at " not in line:
        proc.kill()
        raise RuntimeError(f"dashboard did not start: {line!r}")
    return proc, line.rsplit(" at ", 1)[1].strip().rstrip("/")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(http: httpx.Client, pid: int, params: dict[str, object], repeats: int) -> tuple[list[float], float, int]:
    """Wall-clock ms of each request, the server's CPU ms per request, and the number of matches."""
    times: list[float] = []
    total = 0
    cpu0 = cpu_s(pid)
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = http.get("/api/rollouts", params=params)
        times.append((time.perf_counter() - t0) * 1e3)
        r.raise_for_status()
        total = r.json()["total"]
    return times, (cpu_s(pid) - cpu0) * 1e3 / repeats, total


def row(name: str, times: list[float], cpu_ms: float, total: int) -> str:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"| {name} | {total} | {statistics.median(times):.1f} | {p95:.1f} | {max(times):.1f} | {cpu_ms:.1f} |"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.store) if args.store else Path(tmp) / "store.sqlite"
        fill_s = asyncio.run(fill(path, args.rollouts))
        t0 = time.perf_counter()
        proc, url = start_dashboard(path)
        try:
            with httpx.Client(base_url=url, timeout=120) as http:
                http.get("/api/rollouts", params={"limit": 50}).raise_for_status()
                first_page_s = time.perf_counter() - t0
                # the index reads older rollouts in the background: the queries below need all of them
                while not http.get("/api/info").json()["history_complete"]:
                    time.sleep(0.5)
                history_s = time.perf_counter() - t0
                n = args.repeats
                last = args.rollouts - 50
                queries: list[tuple[str, dict[str, object]]] = [
                    ("first page (50 rows)", {"limit": 50}),
                    (f"deep page (offset {last})", {"limit": 50, "offset": last}),
                    ("status=failed", {"status": "failed"}),
                    ("mode=val", {"mode": "val"}),
                    ("reward 0.5-1", {"reward_min": 0.5, "reward_max": 1}),
                    ("text search (task input)", {"q": "times 7?"}),
                    ("all filters", {"status": "succeeded", "mode": "train", "reward_min": 0.25, "q": "what"}),
                ]
                lines = [row(name, *timed(http, proc.pid, params, n)) for name, params in queries]
                # span-derived filters, after the background span reader is done
                t1 = time.perf_counter()
                while True:
                    info = http.get("/api/info").json()
                    if info["span_progress"]["indexed"] >= info["rollouts"]:
                        break
                    time.sleep(1.0)
                spans_s = time.perf_counter() - t1 + first_page_s
                lines += [
                    row("role=planner (spans read)", *timed(http, proc.pid, {"role": "planner"}, n)),
                    row("model_version=3 (spans read)", *timed(http, proc.pid, {"model_version": 3}, n)),
                    row("first page again (spans read)", *timed(http, proc.pid, {"limit": 50}, n)),
                ]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"Generated {stamp} at commit `{commit}` by `uv run python benchmarks/dashboard_paging.py"
        f"{' --rollouts ' + str(args.rollouts) if args.rollouts != 100_000 else ''}` "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()})."
    )
    print()
    print(
        f"{args.rollouts} rollouts (store filled in {fill_s:.0f} s); first page answered {first_page_s:.1f} s after "
        f"start (newest rollouts read); every rollout in the index after {history_s:.0f} s; every rollout's spans "
        f"read after {spans_s:.0f} s. {n} requests per row, over HTTP, once every rollout is in the index; "
        "wall-clock times include waiting for the CPU on a shared machine, the server's CPU time per request does not:"
    )
    print()
    print("| page request | matching | p50 ms | p95 ms | max ms | server CPU ms / request |")
    print("|---|---:|---:|---:|---:|---:|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
