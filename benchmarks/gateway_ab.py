"""A/B the gateway's CPU per recorded call: two versions of the code side by side, one upstream.

On a shared machine the same code's CPU per call moves by ±15 % with the host's load, more than
most single changes are worth. Running both versions at once and alternating bursts of load
between them makes the comparison fair: a noisy minute hits both. Each version is a source folder
(``packages/core/src`` of a checkout); make one for an older commit with ``git worktree``:

    git worktree add ../before HEAD~1
    uv run python benchmarks/gateway_ab.py ../before/packages/core/src packages/core/src [--rounds 8]

Prints, per version, the median over rounds of the gateway's CPU per call and of the p50 latency
with 32 raw clients (see ``gateway_overhead.py`` for the processes and the client).

``--instructions`` counts instead the user-space instructions each gateway executes per call,
running both under valgrind's callgrind (installed separately; ~50x slower, so use fewer
``--requests``). Counts repeat within ~2 % from round to round whatever the host does (what
moves them is how many calls share an event-loop step), so they show changes of a few per cent
that CPU time hides. They leave out the kernel's share (the
socket system calls) and count some C libraries differently from real hardware (orjson takes
its scalar path under valgrind), so they rank changes to the Python path; CPU time and latency
remain the figures to quote.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gateway_overhead as bench  # noqa: E402  (the sibling benchmark: same processes and client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="Source folder of version A (e.g. <worktree>/packages/core/src).")
    parser.add_argument("b", help="Source folder of version B.")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=10_000, help="Calls per burst.")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    parser.add_argument(
        "--instructions", action="store_true", help="Count instructions per call under callgrind (see above)."
    )
    args = parser.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind (e.g. apt install valgrind).")

    scratch = tempfile.TemporaryDirectory(prefix="lightning-ab-")
    up_port = bench._free_port()  # pyright: ignore[reportPrivateUsage]
    upstream = f"http://127.0.0.1:{up_port}"
    procs = [bench._spawn("--serve-upstream", str(up_port))]  # pyright: ignore[reportPrivateUsage]
    gateways: list[tuple[subprocess.Popen[str], str]] = []
    try:
        bench._wait_ready(f"{upstream}/v1/models")  # pyright: ignore[reportPrivateUsage]
        for i, src in enumerate((args.a, args.b)):
            port = bench._free_port()  # pyright: ignore[reportPrivateUsage]
            store = "memory" if args.store == "memory" else os.path.join(scratch.name, f"{i}.sqlite")
            env = {**os.environ, "PYTHONPATH": os.path.abspath(src), "PYTHONUNBUFFERED": "1"}
            cmd = [sys.executable, bench.__file__, "--serve-gateway", str(port), upstream, store]
            if args.instructions:  # instrumented only while a burst is measured (callgrind_control -i)
                out = os.path.join(scratch.name, f"callgrind-{i}.out")
                log = os.path.join(scratch.name, f"valgrind-{i}.log")
                cmd = [
                    "valgrind",
                    "--tool=callgrind",
                    "--instr-atstart=no",
                    f"--callgrind-out-file={out}",
                    f"--log-file={log}",
                    *cmd,
                ]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
            procs.append(proc)
            assert proc.stdout is not None
            _, attempt, key = proc.stdout.readline().split()
            bench._wait_ready(f"http://127.0.0.1:{port}/health", 300)  # pyright: ignore[reportPrivateUsage]
            url = f"http://127.0.0.1:{port}/rollouts/bench/attempts/{attempt}/key/{key}/v1/chat/completions"
            gateways.append((proc, url))
        if args.instructions:
            counts: list[list[float]] = [[], []]
            for r in range(args.rounds):
                for i in (0, 1) if r % 2 == 0 else (1, 0):
                    proc, url = gateways[i]
                    out = os.path.join(scratch.name, f"callgrind-{i}.out")
                    counts[i].append(_instructions_per_call(proc.pid, out, url, args.clients, args.requests))
            for name, src, per_call in zip("AB", (args.a, args.b), counts, strict=True):
                k = statistics.median(per_call) / 1e3
                print(f"{name} {src}: {k:.1f} k instructions/call (median of {len(per_call)} rounds)")
                print(f"  per round: {', '.join(f'{c / 1e3:.1f}' for c in per_call)}")
            print(f"B / A: {statistics.median(counts[1]) / statistics.median(counts[0]):.3f} instructions per call")
            return
        results: list[list[tuple[float, float]]] = [[], []]
        for r in range(args.rounds):
            for i in (0, 1) if r % 2 == 0 else (1, 0):
                proc, url = gateways[i]
                cpu0 = bench._cpu_s(proc.pid)  # pyright: ignore[reportPrivateUsage]
                m = asyncio.run(bench.measure_raw(url, args.clients, args.requests))
                calls = m["n"] + args.clients * bench.WARMUP_PER_CLIENT
                cpu_ms = (bench._cpu_s(proc.pid) - cpu0) / calls * 1e3  # pyright: ignore[reportPrivateUsage]
                results[i].append((m["p50_ms"], cpu_ms))
        medians: list[tuple[float, float]] = []
        for name, src, rows in zip("AB", (args.a, args.b), results, strict=True):
            cpu = statistics.median(c for _, c in rows)
            p50 = statistics.median(p for p, _ in rows)
            medians.append((cpu, p50))
            print(f"{name} {src}: gateway CPU {cpu:.4f} ms/call, p50 {p50:.2f} ms (medians of {len(rows)} rounds)")
            print(f"  CPU per round: {', '.join(f'{c:.3f}' for _, c in rows)}")
            print(f"  p50 per round: {', '.join(f'{p:.2f}' for p, _ in rows)}")
        (cpu_a, p50_a), (cpu_b, p50_b) = medians
        print(f"B / A: gateway CPU {cpu_b / cpu_a:.3f}, p50 {p50_b / p50_a:.3f}")
    finally:
        bench.stop(procs, scratch)


def _instructions_per_call(pid: int, out: str, url: str, clients: int, requests: int) -> float:
    """Instructions the callgrind-run gateway ``pid`` (profile file ``out``) executes per call in one burst."""

    def control(*args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, check=True)

    control("--zero")
    control("--instr=on")
    m = asyncio.run(bench.measure_raw(url, clients, requests))
    control("--instr=off")
    before = set(glob.glob(out + ".*"))
    control("--dump")
    deadline = time.monotonic() + 60
    while not (new := set(glob.glob(out + ".*")) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not new:
        raise RuntimeError(f"callgrind wrote no profile for pid {pid}")
    time.sleep(0.2)  # let the dump finish writing
    total = 0
    with open(max(new, key=os.path.getmtime)) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    return total / (m["n"] + clients * bench.WARMUP_PER_CLIENT)


if __name__ == "__main__":
    main()
