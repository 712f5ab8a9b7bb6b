"""Does one huge request stall the gateway? Small-call latency and the gateway's RSS while a 30 MB prompt is refused.

Issue 26.4 measured, before the limits: a 10 MB prompt delayed a concurrent 4-token request by
10.6 s, 30 MB took 25.5 s to be refused, and the gateway's RSS rose 0.8 -> 1.9 GB and stayed there.

This starts ``lightning-rl gateway serve --model tiny`` (default limits) as its own process, sends
small chat calls (2 tokens) back to back and, meanwhile, one chat call with a big prompt, three
times: ``--mb`` MB (30: above the 16 MiB body limit, a 413 from its ``Content-Length``), 5 MB (under
that limit but longer than any prompt the tiny model's context can hold: also a 413, unread) and
1.5 MB (short enough to fit by its size: parsed, then refused by the character bound before
tokenising). Reported per row: the big call's status and time (measured in the process that sends
it, so that this client's own work never shows as gateway latency); how long the gateway's own
event loop was blocked while the big body was in flight (a 5 ms timer inside the gateway process:
how late it fired); the small calls' latency (median, max) in that window and over the whole
measured window (0.3 s before the big call to 0.3 s after its answer; the sending process has
started and read its body before it); and the gateway's RSS before, at its peak and 2 s after.

    uv run python benchmarks/gateway_limits.py            # the table in benchmarks/README.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
from _common import git_commit

SMALL: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}


_SENDER = """
import sys, time, httpx
with open(sys.argv[2], "rb") as f:
    body = f.read()
client = httpx.Client(timeout=300)
print("ready", flush=True)
sys.stdin.readline()  # started and loaded before the measured window: go
wall, start = time.time(), time.perf_counter()
r = client.post(sys.argv[1], content=body, headers={"content-type": "application/json"})
print(r.status_code, time.perf_counter() - start, wall)
"""


_GATEWAY = """
import asyncio, atexit, json, os, signal, sys, time
import uvicorn
# a 5 ms timer in the gateway's own event loop: how late it fires is how long the loop was blocked
lags = []
async def probe():
    while True:
        start = time.perf_counter()
        await asyncio.sleep(0.005)
        lags.append((time.time(), max(0.0, (time.perf_counter() - start - 0.005) * 1000)))
serve = uvicorn.Server.serve
async def serve_with_probe(self, *args, **kwargs):
    asyncio.get_running_loop().create_task(probe())
    return await serve(self, *args, **kwargs)
uvicorn.Server.serve = serve_with_probe
@atexit.register
def write_lags():
    with open(os.environ["LAGS_FILE"], "w") as f:
        json.dump(lags, f)
# uvicorn re-raises SIGTERM once it has shut down: exit normally then, so that atexit runs
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
from lightning_rl.cli import main
sys.argv[0] = "lightning-rl"
main()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class _RssSampler:
    """The highest RSS of ``pid`` seen by a thread sampling every 10 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_mb(self.pid))
            time.sleep(0.01)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Result:
    config: str
    status: int
    big_s: float
    small_n: int
    small_p50_ms: float
    small_max_ms: float
    flight_n: int
    """Small calls started while the big body was in flight (from the sender's request to its answer)."""
    flight_p50_ms: float
    flight_max_ms: float
    loop_lag_max_ms: float
    """Longest the gateway's event loop was blocked while the big body was in flight (its 5 ms probe)."""
    baseline_p50_ms: float
    rss_before: float
    rss_peak: float
    rss_after: float


async def _small_calls(http: httpx.AsyncClient, url: str, stop: asyncio.Event) -> list[tuple[float, float]]:
    """(wall-clock start, latency ms) of each small call, back to back until ``stop``."""
    calls: list[tuple[float, float]] = []
    while not stop.is_set():
        wall, start = time.time(), time.perf_counter()
        r = await http.post(f"{url}/v1/chat/completions", json=SMALL)
        r.raise_for_status()
        calls.append((wall, (time.perf_counter() - start) * 1000))
    return calls


async def _measure(name: str, extra: list[str], mb: float) -> Result:
    port = _free_port()
    cmd = [sys.executable, "-c", _GATEWAY, "gateway", "serve", "--model", "tiny"]
    log = tempfile.TemporaryFile()
    lags_file = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    lags_file.close()
    env = {**os.environ, "LAGS_FILE": lags_file.name}
    proc = subprocess.Popen([*cmd, "--port", str(port), *extra], stdout=subprocess.DEVNULL, stderr=log, env=env)
    sent = big_s = float("nan")
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=300) as http:
            deadline = time.monotonic() + 600
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"the gateway did not start: {log.read().decode(errors='replace')[-2000:]}")
                try:
                    if (await http.get(f"{url}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
            stop = asyncio.Event()
            warm = asyncio.create_task(_small_calls(http, url, stop))
            await asyncio.sleep(2.0)
            stop.set()
            baseline = await warm
            rss_before = _rss_mb(proc.pid)
            text = "weather " * int(mb * 1_000_000 / 8)
            raw = json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 2}).encode()
            with tempfile.NamedTemporaryFile(suffix=".json") as body_file, _RssSampler(proc.pid) as rss:
                body_file.write(raw)
                body_file.flush()
                # sent by another process: the small calls must measure the gateway, not this
                # client's own work on 30 MB (one interpreter, one GIL); it starts and reads the body
                # before the small calls begin, so its start-up is not in the measured window
                sender = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    _SENDER,
                    f"{url}/v1/chat/completions",
                    body_file.name,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                )
                assert sender.stdout is not None and sender.stdin is not None
                assert (await sender.stdout.readline()).strip() == b"ready"
                stop = asyncio.Event()
                small = asyncio.create_task(_small_calls(http, url, stop))
                await asyncio.sleep(0.3)
                sender.stdin.write(b"go\n")
                out, _ = await sender.communicate()
                await asyncio.sleep(0.3)  # and a while after the answer
                status_text, seconds, sent_at = out.decode().split()
                status, big_s, sent = int(status_text), float(seconds), float(sent_at)
                stop.set()
                during = [ms for _, ms in await small]
                flight = [ms for wall, ms in small.result() if sent <= wall <= sent + big_s] or [float("nan")]
                await asyncio.sleep(2.0)
            rss_after = _rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    with open(lags_file.name) as f:
        lags: list[list[float]] = json.load(f)
    os.unlink(lags_file.name)
    in_flight = [lag for wall, lag in lags if sent <= wall <= sent + big_s]
    return Result(
        name,
        status,
        big_s,
        len(during),
        statistics.median(during),
        max(during),
        len(flight) if flight[0] == flight[0] else 0,
        statistics.median(flight),
        max(flight),
        max(in_flight, default=float("nan")),
        statistics.median(ms for _, ms in baseline),
        rss_before,
        rss.peak,
        rss_after,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=30.0, help="Size of the big prompt in MB (default 30).")
    args = parser.parse_args()
    configs = [
        (f"{args.mb:g} MB: above the 16 MiB limit", [], args.mb),
        ("5 MB: under the limit, too long for the model's context", [], 5.0),
        ("1.5 MB: could fit, parsed, then refused by the length bound", [], 1.5),
    ]
    results = [asyncio.run(_measure(name, extra, mb)) for name, extra, mb in configs]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cpu = platform.processor() or platform.machine()
    print(
        f"Generated {when} at commit `{git_commit()}` by `uv run python benchmarks/gateway_limits.py"
        f"{'' if args.mb == 30.0 else f' --mb {args.mb:g}'}` ({cpu}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}); the gateway serves the tiny model with its default limits.\n"
    )
    print(
        "| big prompt | big call | answered in | gateway loop blocked, max | small calls while it is in flight: "
        "n, p50 / max | whole window (0.3 s before to 0.3 s after): n, p50 / max | small p50 before | "
        "RSS before / peak / 2 s after |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r.config} | {r.status} | {r.big_s * 1000:.0f} ms | {r.loop_lag_max_ms:.1f} ms | {r.flight_n}, "
            f"{r.flight_p50_ms:.1f} / {r.flight_max_ms:.1f} ms | {r.small_n}, "
            f"{r.small_p50_ms:.1f} / {r.small_max_ms:.1f} ms | {r.baseline_p50_ms:.1f} ms | "
            f"{r.rss_before:.0f} / {r.rss_peak:.0f} / {r.rss_after:.0f} MB |"
        )


if __name__ == "__main__":
    main()
