"""How much latency the gateway adds in front of an OpenAI-compatible upstream.

Setup: a minimal fake vLLM server (``lightning_rl.testing.fast_upstream_app``: one pre-serialised
answer with token ids and logprobs) runs in its own process; the gateway runs in upstream mode in
another process, recording every call as an ``llm.call`` span (rollout URL, in-process MemoryStore
through the SpanWriter). A client process with ``--clients`` concurrent workers sends chat
completions first to the upstream directly, then through the gateway, and reports latency
percentiles and requests/s. Each measurement is repeated ``--runs`` times; the median run is shown.

    uv run python benchmarks/gateway_overhead.py [--clients 32] [--requests 2000] [--runs 3]

Target: <= 2 ms added at p50.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

BODY: dict[str, Any] = {
    "model": "fake-model",
    "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2 + 2?"}],
    "max_tokens": 16,
    "temperature": 1.0,
}


# --------------------------------------------------------------------------------------------
# server processes
# --------------------------------------------------------------------------------------------


def serve_upstream(port: int) -> None:
    import uvicorn

    from lightning_rl.testing import fast_upstream_app

    uvicorn.run(fast_upstream_app(), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def serve_gateway(port: int, upstream: str) -> None:
    import uvicorn

    from lightning_rl.gateway import UpstreamBackend, create_gateway_app
    from lightning_rl.store import MemoryStore
    from lightning_rl.types import RolloutRequest, Task

    async def main() -> None:
        store = MemoryStore()
        await store.enqueue([RolloutRequest(id="bench", task=Task(input=0))])
        [claim] = await store.claim("bench-worker")
        app = create_gateway_app(UpstreamBackend(upstream, model="fake-model"), store=store)
        print(f"ATTEMPT {claim.attempt.id}", flush=True)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
        await server.serve()

    asyncio.run(main())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, env=env)


def _wait_ready(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout_s} s")


# --------------------------------------------------------------------------------------------
# client
# --------------------------------------------------------------------------------------------


async def measure(url: str, clients: int, requests: int) -> dict[str, float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as http:
        for _ in range(clients):  # warm the connections
            (await http.post(url, json=BODY)).raise_for_status()
        per_client = requests // clients

        async def worker() -> None:
            for _ in range(per_client):
                t0 = time.perf_counter()
                r = await http.post(url, json=BODY)
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text}")

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    q = statistics.quantiles(latencies, n=100)
    return {"p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3, "rps": len(latencies) / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=2000, help="Requests per run (split over the clients).")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-gateway", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return
    if args.serve_gateway:
        serve_gateway(int(args.serve_gateway[0]), args.serve_gateway[1])
        return

    up_port, gw_port = _free_port(), _free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    procs = [_spawn("--serve-upstream", str(up_port))]
    try:
        _wait_ready(f"{upstream}/v1/models")
        procs.append(_spawn("--serve-gateway", str(gw_port), upstream))
        assert procs[1].stdout is not None
        attempt = procs[1].stdout.readline().split()[1]
        gateway = f"http://127.0.0.1:{gw_port}"
        _wait_ready(f"{gateway}/health")
        direct_url = f"{upstream}/v1/chat/completions"
        gateway_url = f"{gateway}/rollouts/bench/attempts/{attempt}/v1/chat/completions"
        results: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
        for _ in range(args.runs):
            results["direct"].append(asyncio.run(measure(direct_url, args.clients, args.requests)))
            results["gateway"].append(asyncio.run(measure(gateway_url, args.clients, args.requests)))
        metrics = httpx.get(f"{gateway}/metrics?format=json").json()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    print(f"cpus={os.cpu_count()} clients={args.clients} requests/run={args.requests} runs={args.runs} (median run)")
    print("| path | p50 ms | p99 ms | requests/s |")
    print("|---|---|---|---|")
    for name in ("direct", "gateway"):
        print(f"| {name} | {median(name, 'p50_ms'):.2f} | {median(name, 'p99_ms'):.2f} | {median(name, 'rps'):.0f} |")
    added50 = median("gateway", "p50_ms") - median("direct", "p50_ms")
    added99 = median("gateway", "p99_ms") - median("direct", "p99_ms")
    print(f"| added by the gateway | {added50:.2f} | {added99:.2f} | |")
    print(
        f"spans written={metrics.get('spans_written_total')} dropped={metrics.get('spans_dropped_total')} "
        f"pending={metrics.get('spans_pending')}"
    )


if __name__ == "__main__":
    main()
