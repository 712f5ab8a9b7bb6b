"""How much latency and CPU the gateway adds in front of an OpenAI-compatible upstream.

Setup, three kinds of processes so none steals the others' event loop:

* a minimal fake vLLM server (``lightning_rl.testing.fast_upstream_app``: one pre-serialised answer
  with token ids and logprobs) in its own process;
* the gateway in upstream mode in a second process, recording every call as an ``llm.call`` span
  (rollout URL, ``SpanWriter`` into an in-process ``MemoryStore``, or ``--store sqlite``: a SQLite
  file), served by uvicorn exactly as ``lightning-rl gateway serve`` serves it;
* this process as the client: ``--clients`` concurrent workers, each on its own keep-alive
  connection, for every path. ``--client raw`` (default) writes HTTP/1.1 by hand (~0.02 ms of
  client CPU per request), so the servers are the bottleneck and the gateway's own cost shows in
  full: the strictest measure. ``--client openai`` gives each worker its own ``openai.AsyncOpenAI``
  (32 agents, each with its own SDK client: what the gateway really serves; the SDK costs ~1.3 ms of
  client CPU per request, so the client process is the bottleneck). ``--client httpx`` shares one
  ``httpx.AsyncClient`` pool between the workers (its pool bookkeeping makes it client-bound and
  noisy: p50 moves by several ms between runs).

For each client count, a run sends ``--requests`` chat completions to the upstream directly, then
the same number through the gateway on a rollout URL (recorded: the measured path), then through
the gateway's plain ``/v1`` URL (not recorded: shows what recording costs). Runs alternate, so a
burst of outside load hits every path; each run starts with an untimed warm-up that opens every
connection on both hops. Reported per path: p50/p99 latency and requests/s (each the median over
the runs), and the CPU time each process spent per request (``/proc/<pid>/stat``, summed over all
runs, warm-up included; more stable than wall time on a shared machine). "added" is the recorded
gateway path minus direct. The 1-minute load average before and after is printed: on a shared
machine, quote numbers taken at load < 0.5.

    uv run python benchmarks/gateway_overhead.py [--clients 1,32] [--requests N] [--runs 5]
        [--client raw|openai|httpx] [--store memory|sqlite] [--reference]

``--reference`` adds a fourth path: ``minimal_proxy.py``, a bare forwarding proxy (httptools,
orjson, a pooled upstream connection; no validation, no recording) that shows what the host's
loopback TCP, event loop and JSON alone cost a Python proxy: the floor under the gateway.

Target (issue 3): <= 2 ms added at p50 with 32 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

BODY: dict[str, Any] = {
    "model": "fake-model",
    "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2 + 2?"}],
    "max_tokens": 16,
    "temperature": 1.0,
}
WARMUP_PER_CLIENT = 5
REFERENCE = "minimal proxy (reference)"


# --------------------------------------------------------------------------------------------
# server processes
# --------------------------------------------------------------------------------------------


def serve_upstream(port: int) -> None:
    import uvicorn

    from lightning_rl.testing import fast_upstream_app

    uvicorn.run(fast_upstream_app(), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def serve_gateway(port: int, upstream: str, store_url: str) -> None:
    import uvicorn

    from lightning_rl.gateway import UpstreamBackend, create_gateway_app, uvicorn_config
    from lightning_rl.gateway.server import freeze_startup_heap, run_server
    from lightning_rl.store import open_store
    from lightning_rl.types import RolloutConfig, RolloutRequest, Task

    async def main() -> None:
        store = await open_store(store_url)  # as `lightning-rl gateway serve --store` opens it
        # no worker heartbeats this attempt: a run longer than the default 60 s (a loaded host) would
        # end it and every later call would be refused (409)
        forever = RolloutConfig(heartbeat_timeout_s=86_400.0)
        await store.enqueue([RolloutRequest(id="bench", task=Task(input=0), config=forever)])
        [claim] = await store.claim("bench-worker")
        app = create_gateway_app(UpstreamBackend(upstream, model="fake-model"), store=store)
        print(f"ATTEMPT {claim.attempt.id} {claim.attempt.gateway_key}", flush=True)
        server = uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=port, log_level="warning"))
        freeze_startup_heap()  # as the CLI does
        await server.serve()

    run_server(main())  # as `lightning-rl gateway serve` runs it (uvloop when installed)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, env=env)


def stop(procs: list[subprocess.Popen[str]], scratch: tempfile.TemporaryDirectory[str]) -> None:
    """Stop the server processes, then remove their scratch folder."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=10)
    scratch.cleanup()


def _wait_ready(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout_s} s")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``; 0.0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


# --------------------------------------------------------------------------------------------
# client
# --------------------------------------------------------------------------------------------


class RawClient:
    """One keep-alive HTTP/1.1 connection writing the request by hand (a client that costs ~nothing)."""

    def __init__(self, url: str, body: bytes) -> None:
        parts = httpx.URL(url)
        self.host, self.port = parts.host, parts.port or 80
        head = f"POST {parts.raw_path.decode()} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        self.request = head.encode() + body
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self) -> int:
        if self.conn is None:
            self.conn = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.conn
        writer.write(self.request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        await reader.readexactly(length)
        return status

    async def aclose(self) -> None:
        if self.conn is not None:
            self.conn[1].close()
            await self.conn[1].wait_closed()


Call = Callable[[], Awaitable[None]]
"""One request by one client worker (raises when the answer is not a 200)."""


async def closed_loop(calls: list[Call], requests: int) -> dict[str, float]:
    """Each worker sends its requests back to back: an untimed warm-up (which opens every connection
    on both hops), then ``requests`` split over the workers, timed one by one."""
    latencies: list[float] = []

    async def worker(call: Call, n: int, timed: bool) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            await call()
            if timed:
                latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker(c, WARMUP_PER_CLIENT, False) for c in calls))
    start = time.perf_counter()
    await asyncio.gather(*(worker(c, max(1, requests // len(calls)), True) for c in calls))
    elapsed = time.perf_counter() - start
    latencies.sort()
    q = statistics.quantiles(latencies, n=100)
    return {"p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3, "rps": len(latencies) / elapsed, "n": len(latencies)}


async def measure(url: str, clients: int, requests: int, client: str = "raw") -> dict[str, float]:
    """One closed-loop run of ``clients`` workers against ``url`` with the chosen client."""
    if client == "raw":
        return await measure_raw(url, clients, requests)
    if client == "openai":
        return await measure_openai(url, clients, requests)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as http:

        async def call() -> None:
            r = await http.post(url, json=BODY)
            if r.status_code != 200:
                raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text}")

        return await closed_loop([call] * clients, requests)


async def measure_openai(url: str, clients: int, requests: int) -> dict[str, float]:
    """Each worker is an agent with its own ``openai.AsyncOpenAI`` client (the real SDK, as agents use it)."""
    import openai

    base_url = url.removesuffix("/chat/completions")
    sdks = [openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0) for _ in range(clients)]

    def caller(sdk: openai.AsyncOpenAI) -> Call:
        async def call() -> None:
            await sdk.chat.completions.create(**BODY)

        return call

    try:
        return await closed_loop([caller(sdk) for sdk in sdks], requests)
    finally:
        for sdk in sdks:
            await sdk.close()


async def measure_raw(url: str, clients: int, requests: int) -> dict[str, float]:
    """Each worker writes HTTP/1.1 by hand on its own keep-alive connection."""
    body = json.dumps(BODY).encode()
    conns = [RawClient(url, body) for _ in range(clients)]

    def caller(conn: RawClient) -> Call:
        async def call() -> None:
            status = await conn.post()
            if status != 200:
                raise RuntimeError(f"{url}: HTTP {status}")

        return call

    try:
        return await closed_loop([caller(c) for c in conns], requests)
    finally:
        for c in conns:
            await c.aclose()


def _run(url: str, clients: int, requests: int, pids: dict[str, int], client: str) -> dict[str, float]:
    """One measured run, with the CPU seconds each process spent during it (warm-up included)."""
    before = {name: _cpu_s(pid) for name, pid in pids.items()}
    client_before = time.process_time()
    result = asyncio.run(measure(url, clients, requests, client))
    result["cpu_client"] = time.process_time() - client_before
    for name, pid in pids.items():
        result[f"cpu_{name}"] = _cpu_s(pid) - before[name]
    result["n_total"] = result["n"] + clients * WARMUP_PER_CLIENT
    return result


def _report(clients: int, requests: int, results: dict[str, list[dict[str, float]]]) -> None:
    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    def cpu_ms(name: str, proc: str) -> float:
        runs = results[name]
        return 1e3 * sum(r[f"cpu_{proc}"] for r in runs) / sum(r["n_total"] for r in runs)

    paths = list(results)

    print(f"\n### {clients} client(s), {requests} requests/run, {len(results['direct'])} runs (medians over runs)")
    print("| path | p50 ms | p99 ms | requests/s | gateway CPU ms/req | upstream CPU ms/req | client CPU ms/req |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in paths:
        server = "reference" if name == REFERENCE else "gateway"
        gw_cpu = f"{cpu_ms(name, server):.3f}" if name != "direct" else "-"
        print(
            f"| {name} | {median(name, 'p50_ms'):.2f} | {median(name, 'p99_ms'):.2f} | {median(name, 'rps'):.0f} "
            f"| {gw_cpu} | {cpu_ms(name, 'upstream'):.3f} | {cpu_ms(name, 'client'):.3f} |"
        )
    added50 = median("gateway", "p50_ms") - median("direct", "p50_ms")
    added99 = median("gateway", "p99_ms") - median("direct", "p99_ms")
    print(f"| **added by the gateway** | **{added50:.2f}** | {added99:.2f} | | | | |")
    if REFERENCE in results:
        ref50 = median(REFERENCE, "p50_ms") - median("direct", "p50_ms")
        ref99 = median(REFERENCE, "p99_ms") - median("direct", "p99_ms")
        print(f"| added by the minimal proxy (reference) | {ref50:.2f} | {ref99:.2f} | | | | |")
    for name in paths:
        runs = ", ".join(f"{r['p50_ms']:.2f}" for r in results[name])
        print(f"{name} p50 per run: {runs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,32", help="Comma-separated concurrent client counts.")
    parser.add_argument(
        "--requests",
        type=int,
        default=None,
        help="Requests per run, split over the clients (default: 20000 with the raw client, else 4000).",
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--client", choices=("raw", "openai", "httpx"), default="raw", help="The client (see above).")
    parser.add_argument(
        "--store",
        choices=("memory", "sqlite"),
        default="memory",
        help="Where the gateway records: an in-process MemoryStore (the default; spans kept as JSON text in the "
        "gateway's heap) or a SQLite file in a scratch folder (what `gateway serve --store PATH` and the trainer "
        "use; its writer thread shares the gateway's process and GIL).",
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="Also measure benchmarks/minimal_proxy.py (a bare forwarding proxy: the floor a Python gateway "
        "can reach on this host) as a fourth path.",
    )
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-gateway", nargs=3, metavar=("PORT", "UPSTREAM", "STORE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return
    if args.serve_gateway:
        serve_gateway(int(args.serve_gateway[0]), args.serve_gateway[1], args.serve_gateway[2])
        return

    client_counts = [int(c) for c in str(args.clients).split(",") if c.strip()]
    requests = args.requests or (20_000 if args.client == "raw" else 4_000)  # ~2-10 s per path and run
    up_port, gw_port = _free_port(), _free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    scratch = tempfile.TemporaryDirectory(prefix="lightning-bench-")
    store_url = "memory" if args.store == "memory" else os.path.join(scratch.name, "store.sqlite")
    procs = [_spawn("--serve-upstream", str(up_port))]
    load_before = _load()
    try:
        _wait_ready(f"{upstream}/v1/models")
        procs.append(_spawn("--serve-gateway", str(gw_port), upstream, store_url))
        assert procs[1].stdout is not None
        _, attempt, key = procs[1].stdout.readline().split()
        gateway = f"http://127.0.0.1:{gw_port}"
        _wait_ready(f"{gateway}/health")
        pids = {"upstream": procs[0].pid, "gateway": procs[1].pid}
        urls = {
            "direct": f"{upstream}/v1/chat/completions",
            "gateway": f"{gateway}/rollouts/bench/attempts/{attempt}/key/{key}/v1/chat/completions",
            "gateway, not recorded": f"{gateway}/v1/chat/completions",
        }
        if args.reference:
            ref_port = _free_port()
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "minimal_proxy.py")
            reference = subprocess.Popen(
                [sys.executable, script, str(ref_port), str(up_port)], stdout=subprocess.PIPE, text=True
            )
            procs.append(reference)
            assert reference.stdout is not None
            reference.stdout.readline()  # READY
            pids["reference"] = reference.pid
            urls[REFERENCE] = f"http://127.0.0.1:{ref_port}/v1/chat/completions"
        print(
            f"cpus={os.cpu_count()} python={sys.version.split()[0]} client={args.client} store={args.store} "
            f"load(1 min) before={load_before:.2f}",
            flush=True,
        )
        for clients in client_counts:
            results: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
            for _ in range(args.runs):
                for name, url in urls.items():
                    results[name].append(_run(url, clients, requests, pids, args.client))
            _report(clients, requests, results)
        deadline = time.monotonic() + 30.0  # let the writer drain, so "written" counts every recorded call
        while True:
            metrics = httpx.get(f"{gateway}/metrics?format=json").json()
            if not metrics.get("spans_pending") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        stop(procs, scratch)
    print(
        f"\nspans written={metrics.get('spans_written_total')} dropped={metrics.get('spans_dropped_total')} "
        f"pending={metrics.get('spans_pending')}; load(1 min) after={_load():.2f}"
    )


if __name__ == "__main__":
    main()
