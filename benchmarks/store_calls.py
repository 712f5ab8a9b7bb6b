"""Python function calls per rollout on the store server and its client: an A/B that load cannot move.

``store_throughput.py``'s rollouts/s and CPU ms per rollout move by 10-20 % from run to run on a
shared 2-core host, more than most single changes to the store are worth. The number of Python
function calls a rollout costs does not depend on the host at all. This script serves a SQLite
store (``lightning-rl store serve``) under ``cProfile``, runs ``store_throughput.py``'s runner loop
(claim -> add 10 spans -> finish, 32 runners) against it through ``StoreClient`` with the client
profiled too, and prints the calls per rollout of each side. Start-up (imports, the server's
start) is taken out by running twice, with a small and a large backlog, and reporting the
difference per extra rollout. Calls are not time: one call into pydantic or SQLite may cost more
than fifty Python ones, so use it to find where a change adds Python work, and quote CPU time from
``store_throughput.py``.

Each source folder is ``packages/core/src`` of a checkout (``git worktree add ../before <rev>``)::

    uv run python benchmarks/store_calls.py ../before/packages/core/src packages/core/src [--top 15]
"""

from __future__ import annotations

import argparse
import os
import pstats
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["main"]

_SERVE = """
import cProfile, sys
from lightning_rl.cli import main
prof = cProfile.Profile()
prof.enable()
try:
    main(["store", "serve", "--backend", "sqlite", "--path", sys.argv[1], "--port", "0"])
finally:
    prof.disable()
    prof.dump_stats(sys.argv[2])
"""

_CLIENT = """
import asyncio, cProfile, sys, time
sys.path.insert(0, sys.argv[4])
import store_throughput as st
from lightning_rl.store.client import StoreClient
from lightning_rl.types import RolloutRequest, Task

async def main():
    client = StoreClient(sys.argv[1])
    await client.enqueue([RolloutRequest(task=Task(input={"q": i})) for i in range(int(sys.argv[2]))])
    done = [0]
    prof = cProfile.Profile()
    prof.enable()
    await asyncio.gather(*(st.runner(client, f"w{i}", 10, time.perf_counter() + 3600, done) for i in range(32)))
    prof.disable()
    prof.dump_stats(sys.argv[3])
    await client.close()
    assert done[0] == int(sys.argv[2]), done

asyncio.run(main())
"""

Counts = dict[tuple[str, str], int]


def profile(src: str, rollouts: int, workdir: Path) -> tuple[pstats.Stats, pstats.Stats]:
    """Server and client profiles of one run of ``rollouts`` rollouts with the code in ``src``."""
    env = {**os.environ, "PYTHONPATH": src}
    server_prof, client_prof = workdir / f"server-{rollouts}.prof", workdir / f"client-{rollouts}.prof"
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(workdir / f"store-{rollouts}.db"), str(server_prof)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        url = ""
        while not url:
            line = server.stdout.readline()
            if not line:
                raise SystemExit(f"the store server of {src} ended before serving")
            url = next((w.rstrip(".,") for w in line.split() if w.startswith("http://")), "")
        bench = str(Path(__file__).resolve().parent)
        subprocess.run(
            [sys.executable, "-c", _CLIENT, url, str(rollouts), str(client_prof), bench], env=env, check=True
        )
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    return pstats.Stats(str(server_prof)), pstats.Stats(str(client_prof))


def _short(path: str) -> str:
    """A module's path from its package on (no machine's folders in the output)."""
    return re.split(r"site-packages/|/src/|/lib/python\d+\.\d+/", path)[-1]


def per_rollout(small: pstats.Stats, large: pstats.Stats, extra: int) -> Counts:
    """Calls per extra rollout of each function (``file:function``), start-up taken out."""
    out: Counts = {}
    a: dict[tuple[str, int, str], tuple[int, ...]] = small.stats  # type: ignore[attr-defined]
    b: dict[tuple[str, int, str], tuple[int, ...]] = large.stats  # type: ignore[attr-defined]
    for key in set(a) | set(b):
        calls = b.get(key, (0, 0))[1] - a.get(key, (0, 0))[1]
        name = (_short(key[0]), re.sub(r" at 0x[0-9a-f]+", "", key[2]))  # builtins' addresses differ per process
        out[name] = out.get(name, 0) + calls
    return {k: v for k, v in out.items() if v}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="source folder of version A (<checkout>/packages/core/src)")
    parser.add_argument("b", help="source folder of version B")
    parser.add_argument("--small", type=int, default=200, help="rollouts of the start-up run")
    parser.add_argument("--large", type=int, default=1200, help="rollouts of the measured run")
    parser.add_argument("--top", type=int, default=12, help="functions listed per side, by change in calls")
    args = parser.parse_args(argv)
    extra = args.large - args.small
    results: list[dict[str, Counts]] = []
    for src in (args.a, args.b):
        with tempfile.TemporaryDirectory() as d:
            small = profile(src, args.small, Path(d))
            large = profile(src, args.large, Path(d))
        results.append({side: per_rollout(small[i], large[i], extra) for i, side in enumerate(("server", "client"))})
    for side in ("server", "client"):
        totals = [sum(r[side].values()) / extra for r in results]
        print(
            f"{side}: A {totals[0]:.0f}, B {totals[1]:.0f} Python calls per rollout (B / A {totals[1] / totals[0]:.3f})"
        )
        names = set(results[0][side]) | set(results[1][side])
        changed = sorted(names, key=lambda n: -abs(results[1][side].get(n, 0) - results[0][side].get(n, 0)))
        for name in changed[: args.top]:
            ca, cb = (r[side].get(name, 0) / extra for r in results)
            if abs(cb - ca) >= 0.5:
                print(f"  {cb - ca:+7.1f}  A {ca:6.1f}  B {cb:6.1f}  {name[0]}:{name[1]}")


if __name__ == "__main__":
    main()
