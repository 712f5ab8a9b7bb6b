"""Do the framework examples learn? Each example's ``train.py`` per seed, with and without AIR (issue 22).

Issue 22 asks every example (``examples/sql_agent``, ``calc_agent``, ``rag_agent``, ``crew_agent``)
to gain at least +0.3 held-out reward on at least 100 held-out tasks on each of 3 seeds, in at most
10 minutes a run on 2 cores, and asks for an AIR ablation (the same runs with
``--tool-error-reward 0``) and per-role figures. One run per seed proves little and a hand-typed
table proves nothing, so this script runs the unchanged example command in a fresh process per
(example, seed, AIR on/off)::

    python examples/<name>/train.py --seed S --out DIR --quiet [--tool-error-reward 0]

reads each run's ``DIR/metrics.jsonl`` and writes

- ``<out>/results.json``: every run's command, exit status, wall time and metric rows, unreduced;
- ``<out>/examples.md`` (and stdout): per example, the seeds table (held-out before/after, gain,
  wall time, held-out tasks), mean and min gain and the verdict against issue 22's targets, the
  per-role table (calls, trained transitions, mean AIR, tool-error and tool-call rate at the first
  and last step) and, for the ablated examples, the with/without-AIR table; each block is headed by
  the date, commit, machine, thread count and the exact command;
- ``<out>/<name>/learning.png``: held-out reward per seed over steps (dashed: without AIR) and, where
  the runs log it, the training tool-error rate.

``--write-readmes`` pastes each block between ``<!-- benchmarks/examples.py:begin -->`` and
``<!-- benchmarks/examples.py:end -->`` in ``examples/<name>/README.md`` (appending a "Measured"
section with the markers when they are missing), copies the plot to ``examples/<name>/learning.png``,
and fills the example's block in ``benchmarks/README.md``. ``--paste results.json`` renders (and
with ``--write-readmes`` pastes) an earlier run again without running anything, so README numbers
are always this script's output. A run that fails or times out is recorded as such, never dropped:
the script then exits 1 and leaves the READMEs alone (``--paste`` pastes what there is).

``--arms shared,frozen,per_role`` (issue 42) runs each seed of the multi-agent examples (``sql_agent``,
``rag_agent``) once per way of serving the roles: ``shared`` (one policy for every role), ``frozen``
(``--untrainable-roles frozen``: the untrained roles on a second copy of the starting weights) and
``per_role`` (``--adapters per_role``: one LoRA adapter per trainable role over one base). Its table
(``<!-- benchmarks/examples.py:arms:begin -->`` in the README) gives the held-out reward, the drift of the
frozen role (the planner's handoff rate; the checker's verdicts, read from the run's store), the
process's peak memory (the largest ``mem/*_peak_gb`` the run logged) and the wall time per arm.

``--parallel N`` runs N example runs at once with ``OMP_NUM_THREADS`` = cores // N each (the header
says so): the gains are measured, the wall times then are not comparable with the 10-minute target.

    uv run python benchmarks/examples.py                                   # all four, seeds 0-2, ablation
    uv run python benchmarks/examples.py --examples calc_agent --seeds 0 --air-ablation ""
    uv run python benchmarks/examples.py --extra-args calc_agent="--steps 2" --extra-args="--n-val 8"
    uv run python benchmarks/examples.py --paste runs/bench_examples/results.json --write-readmes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import cpu_name, git_commit, parse_seeds, phase_peaks_gb

__all__ = [
    "EXAMPLES",
    "Run",
    "held_out_curve",
    "tool_error_series",
    "role_stats",
    "summary",
    "verdict",
    "render_example",
    "paste_block",
    "plot_example",
    "main",
]

EXAMPLES = ("sql_agent", "calc_agent", "rag_agent", "crew_agent")
DEFAULT_ABLATION = ("calc_agent", "rag_agent")
TARGET_GAIN = 0.3  # issue 22: held-out gain on every seed
TARGET_TASKS = 100  # ... scored on at least this many held-out tasks
TARGET_SEEDS = 3
LIMIT_MIN = 10.0  # ... each run within this many minutes on 2 cores
BEGIN, END = "<!-- benchmarks/examples.py:begin -->", "<!-- benchmarks/examples.py:end -->"
REPO = Path(__file__).resolve().parents[1]
BENCH_END_ANY = r"<!-- benchmarks/examples\.py:\w+:end -->"
ARMS_BEGIN, ARMS_END = "<!-- benchmarks/examples.py:arms:begin -->", "<!-- benchmarks/examples.py:arms:end -->"
ARMS: dict[str, dict[str, list[str]]] = {
    # train.py arguments of each arm; the examples' own defaults differ (rag freezes its planner by default)
    "sql_agent": {
        "shared": ["--untrainable-roles", "shared"],
        "frozen": ["--untrainable-roles", "frozen"],
        "per_role": ["--adapters", "per_role"],
    },
    "rag_agent": {
        "shared": ["--untrainable-roles", "shared"],
        "frozen": ["--untrainable-roles", "frozen"],
        "per_role": ["--adapters", "per_role"],
    },
}
FROZEN_ROLE = {"sql_agent": "checker", "rag_agent": "planner"}
ROLE_KEY = re.compile(r"^(train|val)/role/(.+)/([^/]+)$")


def bench_markers(example: str) -> tuple[str, str]:
    """The markers of ``example``'s block in ``benchmarks/README.md`` (one block per example, so a
    run of one example leaves the others' numbers in place)."""
    return f"<!-- benchmarks/examples.py:{example}:begin -->", f"<!-- benchmarks/examples.py:{example}:end -->"


@dataclass
class Run:
    """One ``train.py`` process: what was run and everything it left, unreduced."""

    example: str
    seed: int
    air: bool  # False: the ablation, run with --tool-error-reward 0
    command: list[str]
    returncode: int | None  # None: killed at --timeout-min
    wall_s: float
    error: str | None = None
    log: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    warm_start: dict[str, Any] | None = None
    resumed: bool = False  # finished by an earlier, interrupted invocation (--resume); wall time from its log
    arm: str = ""  # --arms: how the roles were served ("" outside the arms comparison)
    verdicts: dict[str, dict[str, int]] | None = None  # sql_agent: the checker's verdicts per training step

    @property
    def label(self) -> str:
        return (
            f"{self.example} seed {self.seed}"
            + ("" if self.air else " without AIR")
            + (f" ({self.arm})" if self.arm else "")
        )


# --- reading a run's metrics ------------------------------------------------------------------


def _num(value: Any) -> float | None:
    """A finite float, else None (metrics.jsonl writes NaN for "no data this step")."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def held_out_curve(rows: Sequence[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, held-out reward) of every validation row: step 0 is before training, the last after."""
    out: list[tuple[int, float]] = []
    for r in rows:
        value = _num(r.get("val/reward_mean"))
        if value is not None:
            out.append((int(r.get("step", 0)), value))
    return out


def _train_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "train/reward_mean" in r]


def _step_tool_error(row: dict[str, Any], prefix: str = "train") -> float | None:
    """A step's tool-error rate over all roles: ``<prefix>/tool_error_rate`` when the trainer logs
    it, else the per-role rates weighted by the role's calls (the plain mean where calls are not
    logged), which is the rate over all calls."""
    overall = _num(row.get(f"{prefix}/tool_error_rate"))
    if overall is not None:
        return overall
    rates: list[tuple[float, float | None]] = []
    for key, raw in row.items():
        m = ROLE_KEY.match(key)
        if m and m[1] == prefix and m[3] == "tool_error_rate" and (rate := _num(raw)) is not None:
            rates.append((rate, _num(row.get(f"{prefix}/role/{m[2]}/calls"))))
    if not rates:
        return None
    if all(calls is not None for _, calls in rates) and (n := sum(c or 0.0 for _, c in rates)) > 0:
        return sum(rate * (calls or 0.0) for rate, calls in rates) / n
    return statistics.fmean(rate for rate, _ in rates)


def tool_error_series(rows: Sequence[dict[str, Any]], prefix: str = "train") -> list[tuple[int, float]]:
    """(step, tool-error rate) of every training step (``prefix="val"``: every validation) that has one."""
    out: list[tuple[int, float]] = []
    marker = "train/reward_mean" if prefix == "train" else "val/reward_mean"
    for r in rows:
        value = _step_tool_error(r, prefix) if marker in r else None
        if value is not None:
            out.append((int(r.get("step", 0)), value))
    return out


def role_stats(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per role, over the training steps: calls and trained transitions summed, AIR averaged, and
    the tool-error and tool-call rates and the weights version that answered the role (frozen roles stay
    at 0) of the first and the last step that logged them."""
    train = _train_rows(rows)
    series: dict[str, dict[str, list[float]]] = {}
    for r in train:
        for key, raw in r.items():
            m = ROLE_KEY.match(key)
            value = _num(raw)
            if m and m[1] == "train" and value is not None:
                series.setdefault(m[2], {}).setdefault(m[3], []).append(value)
    out: dict[str, dict[str, float | None]] = {}
    for role, metrics in sorted(series.items()):

        def total(name: str, metrics: dict[str, list[float]] = metrics) -> float | None:
            return sum(metrics[name]) if name in metrics else None

        def ends(name: str, metrics: dict[str, list[float]] = metrics) -> tuple[float | None, float | None]:
            values = metrics.get(name)
            return (values[0], values[-1]) if values else (None, None)

        air = metrics.get("air_mean")
        error_first, error_last = ends("tool_error_rate")
        call_first, call_last = ends("tool_call_rate")
        version_first, version_last = ends("weights_version")
        out[role] = {
            "calls": total("calls"),
            "trained_transitions": total("trained_transitions"),
            "air_mean": statistics.fmean(air) if air else None,
            "tool_error_first": error_first,
            "tool_error_last": error_last,
            "tool_call_first": call_first,
            "tool_call_last": call_last,
            "weights_first": version_first,
            "weights_last": version_last,
        }
    return out


def summary(run: Run) -> dict[str, Any]:
    """The figures the tables show, derived from the run's rows (so ``--paste`` derives them again)."""
    curve = held_out_curve(run.rows)
    counts = [int(v) for r in run.rows if "val/reward_mean" in r if (v := _num(r.get("val/n_rollouts"))) is not None]
    errors = tool_error_series(run.rows)
    val_errors = tool_error_series(run.rows, "val")
    calls = [v for r in run.rows if "val/reward_mean" in r if (v := _num(r.get("val/tool_call_rate"))) is not None]
    ok = run.error is None and len(curve) >= 2
    return {
        "ok": ok,
        "before": curve[0][1] if ok else None,
        "after": curve[-1][1] if ok else None,
        "gain": curve[-1][1] - curve[0][1] if ok else None,
        "n_held_out": min(counts) if counts else None,
        "wall_min": run.wall_s / 60,
        "tool_error_first": errors[0][1] if errors else None,
        "tool_error_last": errors[-1][1] if errors else None,
        "first_step": errors[0][0] if errors else None,
        "last_step": errors[-1][0] if errors else None,
        "val_tool_error_before": val_errors[0][1] if val_errors else None,
        "val_tool_error_after": val_errors[-1][1] if val_errors else None,
        "val_tool_call_before": calls[0] if calls else None,
        "val_tool_call_after": calls[-1] if calls else None,
        "roles": role_stats(run.rows),
    }


def verdict(runs: Sequence[Run]) -> tuple[bool, list[str]]:
    """Issue 22's target on the AIR-on runs of one example: (met?, what falls short)."""
    main_runs = [r for r in runs if r.air]
    sums = [summary(r) for r in main_runs]
    misses: list[str] = []
    failed = [r.seed for r, s in zip(main_runs, sums, strict=True) if not s["ok"]]
    if failed:
        misses.append(f"seed(s) {', '.join(map(str, failed))} did not finish")
    done = [s for s in sums if s["ok"]]
    if len(done) < TARGET_SEEDS:
        misses.append(f"{len(done)} seed(s) finished, the target needs {TARGET_SEEDS}")
    low = [f"{s['gain']:+.2f}" for s in done if s["gain"] < TARGET_GAIN]
    if low:
        misses.append(f"gain below +{TARGET_GAIN:.1f} ({', '.join(low)})")
    if any(s["n_held_out"] is None for s in done):
        misses.append("the number of held-out tasks (val/n_rollouts) was not logged")
    few = sorted({s["n_held_out"] for s in done if s["n_held_out"] is not None and s["n_held_out"] < TARGET_TASKS})
    if few:
        misses.append(f"{'/'.join(map(str, few))} held-out tasks, the target needs {TARGET_TASKS}")
    slow = [f"{s['wall_min']:.1f}" for s in sums if s["wall_min"] > LIMIT_MIN]
    if slow:
        misses.append(f"run(s) over {LIMIT_MIN:.0f} min ({', '.join(slow)} min)")
    return not misses, misses


# --- rendering ----------------------------------------------------------------------------------


def _f(value: float | None, fmt: str = ".2f") -> str:
    return "—" if value is None else format(value, fmt)


def _arrow(first: float | None, last: float | None, fmt: str = ".2f") -> str:
    return "—" if first is None and last is None else f"{_f(first, fmt)} → {_f(last, fmt)}"


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def header_line(header: dict[str, Any]) -> str:
    return (
        f"Generated {header['date']} at commit `{header['commit']}` by `{header['command']}` "
        f"({header['machine']}; {header['threads_note']})."
    )


def _seeds_table(runs: Sequence[Run]) -> list[str]:
    lines = [
        "| seed | held-out before | after | gain | wall | held-out tasks |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        s = summary(r)
        if s["ok"]:
            cells = [_f(s["before"]), _f(s["after"]), f"**{s['gain']:+.2f}**"]
        else:
            cells = ["—", "—", f"**failed**: {r.error or 'fewer than two held-out rows'}"]
        n = "—" if s["n_held_out"] is None else str(s["n_held_out"])
        wall = f"{s['wall_min']:.1f} min" + (" *" if r.resumed else "")
        lines.append(f"| {r.seed} | " + " | ".join([*cells, wall, n]) + " |")
    if any(r.resumed for r in runs):
        lines += [
            "",
            "\\* finished by an earlier invocation of this script with the same `--out` (one that was interrupted, "
            "or one run beside another on other seeds); collected with `--resume`, its wall time from its log's "
            "creation to its last write.",
        ]
    return lines


def _roles_table(runs: Sequence[Run]) -> list[str]:
    steps = [s for s in map(summary, runs) if s["ok"]]
    per_seed = [s["roles"] for s in steps]
    roles = sorted({role for stats in per_seed for role in stats})
    if not roles:
        return ["The runs logged no per-role metrics (`train/role/<role>/...`)."]
    first = next((s["first_step"] for s in steps if s["first_step"] is not None), None)
    last = next((s["last_step"] for s in steps if s["last_step"] is not None), None)
    span = f"step {first} → {last}" if first is not None else "first → last step"
    lines = [
        f"Per role, with AIR, mean over {len(per_seed)} seed(s) (calls and trained transitions summed over the run):",
        "",
        f"| role | trains | calls | trained transitions | mean AIR | tool-error rate ({span}) "
        f"| tool-call rate ({span}) | weights version ({span}) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for role in roles:
        stats = [s[role] for s in per_seed if role in s]

        def m(key: str, stats: list[dict[str, float | None]] = stats) -> float | None:
            return _mean(s.get(key) for s in stats)

        trained = m("trained_transitions")
        trains = "?" if trained is None else ("yes" if trained > 0 else "no")
        calls = m("calls")
        cells = [
            role,
            trains,
            _f(calls, ".0f"),
            _f(trained, ".0f"),
            _f(m("air_mean"), "+.3f"),
            _arrow(m("tool_error_first"), m("tool_error_last")),
            _arrow(m("tool_call_first"), m("tool_call_last")),
            _arrow(m("weights_first"), m("weights_last"), ".0f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ablation_table(runs: Sequence[Run]) -> list[str]:
    by_seed: dict[int, dict[bool, Run]] = {}
    for r in runs:
        by_seed.setdefault(r.seed, {})[r.air] = r
    lines = [
        "With and without AIR (`--tool-error-reward 0`), same seeds:",
        "",
        "| seed | AIR | held-out before | after | gain | training tool-error rate (first → last step) "
        "| held-out tool-error rate (before → after) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    gains: dict[bool, list[float]] = {True: [], False: []}
    last_errors: dict[bool, list[float | None]] = {True: [], False: []}
    val_errors: dict[bool, list[float | None]] = {True: [], False: []}
    for seed in sorted(by_seed):
        for air in (True, False):
            r = by_seed[seed].get(air)
            if r is None:
                continue
            s = summary(r)
            label = "on" if air else "off"
            if s["ok"]:
                gains[air].append(s["gain"])
                last_errors[air].append(s["tool_error_last"])
                val_errors[air].append(s["val_tool_error_after"])
                cells = [_f(s["before"]), _f(s["after"]), f"{s['gain']:+.2f}"]
            else:
                cells = ["—", "—", f"failed: {r.error}"]
            rates = [_arrow(s["tool_error_first"], s["tool_error_last"])]
            rates.append(_arrow(s["val_tool_error_before"], s["val_tool_error_after"]))
            lines.append(f"| {seed} | {label} | " + " | ".join([*cells, *rates]) + " |")
    parts: list[str] = []
    for air, name in ((True, "with AIR"), (False, "without")):
        if gains[air]:
            parts.append(
                f"{name} mean gain **{statistics.fmean(gains[air]):+.2f}** (min {min(gains[air]):+.2f}), "
                f"tool-error rate at the last step {_f(_mean(last_errors[air]))}, "
                f"held-out after training {_f(_mean(val_errors[air]))}"
            )
    if parts:
        lines += ["", "; ".join(parts) + "."]
    return lines


def render_example(example: str, runs: Sequence[Run], header: dict[str, Any], image: str | None) -> str:
    """The markdown block of one example: what its README shows between the markers."""
    main_runs = sorted((r for r in runs if r.air), key=lambda r: r.seed)
    lines = [header_line(header), ""]
    if main_runs:
        lines += _seeds_table(main_runs)
        done = [summary(r) for r in main_runs if summary(r)["ok"]]
        if done:
            gains = [s["gain"] for s in done]
            walls = [summary(r)["wall_min"] for r in main_runs]
            counts = sorted({s["n_held_out"] for s in done if s["n_held_out"] is not None})
            lines += [
                "",
                f"Gain over {len(done)} seed(s): mean **{statistics.fmean(gains):+.2f}**, min **{min(gains):+.2f}**. "
                f"Wall time: max {max(walls):.1f} min. Held-out tasks per evaluation: "
                f"{', '.join(map(str, counts)) or 'not logged'}.",
            ]
        met, misses = verdict(main_runs)
        target = (
            f"Issue 22's target (gain ≥ +{TARGET_GAIN:.1f} on each of {TARGET_SEEDS} seeds, ≥ {TARGET_TASKS} "
            f"held-out tasks, ≤ {LIMIT_MIN:.0f} min a run on 2 cores): "
        )
        lines.append(target + ("**met**." if met else "**not met**: " + "; ".join(misses) + "."))
        if header.get("parallel", 1) > 1:
            lines.append(f"({header['parallel']} runs shared the machine, so the wall times overstate a lone run.)")
        lines += ["", *_roles_table(main_runs)]
    if any(not r.air for r in runs):
        lines += ["", *_ablation_table(runs)]
    if image:
        lines += ["", f"![{example}: held-out reward per seed]({image})"]
    return "\n".join(lines) + "\n"


def peak_memory_gb(rows: Sequence[dict[str, Any]]) -> float | None:
    """The process's peak resident memory over the run: the largest ``mem/<phase>_peak_gb`` it logged."""
    values = [v for v in phase_peaks_gb(rows) if math.isfinite(v)]
    return max(values) if values else None


def frozen_drift(run: Run) -> tuple[str, float | None, float | None]:
    """(what, first, last) for the example's frozen role over the training steps: the planner's handoff
    (tool-call) rate, or the share of the checker's replies that say ``CORRECT``."""
    if run.example == "sql_agent":
        steps = sorted((run.verdicts or {}).items(), key=lambda kv: int(kv[0]))

        def share(counts: dict[str, int]) -> float | None:
            n = sum(counts.values())
            return counts["CORRECT"] / n if n else None

        return (
            "checker CORRECT share",
            share(steps[0][1]) if steps else None,
            share(steps[-1][1]) if steps else None,
        )
    stats = role_stats(run.rows).get(FROZEN_ROLE.get(run.example, ""), {})
    return (
        f"{FROZEN_ROLE.get(run.example, '?')} handoff rate",
        stats.get("tool_call_first"),
        stats.get("tool_call_last"),
    )


def _verdict_cell(run: Run) -> str:
    """The checker's verdict counts (CORRECT / WRONG / other) at the first and the last training step."""
    steps = sorted((run.verdicts or {}).items(), key=lambda kv: int(kv[0]))
    if not steps:
        return "—"

    def cell(counts: dict[str, int]) -> str:
        return f"{counts['CORRECT']}/{counts['WRONG']}/{counts['other']}"

    return f"{cell(steps[0][1])} → {cell(steps[-1][1])}"


def render_arms(
    example: str, runs: Sequence[Run], header: dict[str, Any], warm_starts: Sequence[dict[str, Any]] = ()
) -> str:
    """Issue 42's comparison of one example: per arm and seed, held-out reward, the frozen role's drift,
    peak memory and wall time; then per arm the mean and min gain and the mean peak memory; then the
    shared warm starts' times (runs made before they were shared have none)."""
    order = {arm: i for i, arm in enumerate(ARMS.get(example, {}))}
    runs = sorted(runs, key=lambda r: (order.get(r.arm, 99), r.seed))
    what = frozen_drift(runs[0])[0] if runs else "frozen role"
    verdicts = example == "sql_agent"
    lines = [header_line(header), ""]
    head = f"| arm | seed | held-out before | after | gain | {what} (step first → last) |"
    head += " checker verdicts C/W/other (first → last) |" if verdicts else ""
    lines += [
        head + " peak memory | wall |",
        "|---|---:|---:|---:|---:|---:|" + ("---:|" if verdicts else "") + "---:|---:|",
    ]
    per_arm: dict[str, list[tuple[float | None, float | None]]] = {}
    for r in runs:
        s = summary(r)
        _, first, last = frozen_drift(r)
        mem = peak_memory_gb(r.rows)
        per_arm.setdefault(r.arm, []).append((s["gain"] if s["ok"] else None, mem))
        cells = [r.arm, str(r.seed)]
        if s["ok"]:
            cells += [_f(s["before"]), _f(s["after"]), f"**{s['gain']:+.2f}**"]
        else:
            cells += ["—", "—", f"**failed**: {r.error or 'fewer than two held-out rows'}"]
        cells.append(_arrow(first, last))
        if verdicts:
            cells.append(_verdict_cell(r))
        cells += [_f(mem, ".2f") + " GB" if mem is not None else "—", f"{s['wall_min']:.1f} min"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| arm | seeds | mean gain | min gain | mean peak memory |", "|---|---:|---:|---:|---:|"]
    for arm, values in per_arm.items():
        gains = [g for g, _ in values if g is not None]
        mems = [m for _, m in values if m is not None]
        lines.append(
            f"| {arm} | {len(gains)} of {len(values)} | "
            + (f"**{statistics.fmean(gains):+.2f}** | {min(gains):+.2f}" if gains else "— | —")
            + f" | {_f(_mean(mems), '.2f')} GB |"
        )
    mine = sorted((w for w in warm_starts if w["example"] == example), key=lambda w: int(w["seed"]))
    if mine:
        times = ", ".join(
            f"seed {w['seed']} " + (f"failed ({w['error']})" if w["error"] else f"{w['wall_s'] / 60:.1f} min")
            for w in mine
        )
        lines += [
            "",
            f"Each seed's arms start from one warm start (`train.py --warm-only`, then `--model <it>"
            f" --warm-start-steps 0`), so the wall column is the RL phase alone. Warm starts: {times}.",
        ]
    return "\n".join(lines) + "\n"


# --- writing READMEs and plots ------------------------------------------------------------------


def paste_block(
    path: Path, text: str, begin: str = BEGIN, end: str = END, heading: str = "## Measured", after: str | None = None
) -> None:
    """Replace what lies between ``begin`` and ``end`` in ``path`` with ``text``. A file without the
    markers gets them under ``heading``: after the last match of the regex ``after`` if given and
    found (the other examples' blocks), else at the end. Nothing else in the file changes."""
    content = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    block = f"{begin}\n{text}{end}"
    if pattern.search(content):
        path.write_text(pattern.sub(lambda _: block, content, count=1))
        return
    anchors = list(re.finditer(after, content)) if after else []
    if anchors:
        cut = anchors[-1].end()
        path.write_text(f"{content[:cut]}\n\n{heading}\n\n{block}{content[cut:]}")
        return
    sep = "" if not content or content.endswith("\n\n") else ("\n" if content.endswith("\n") else "\n\n")
    path.write_text(f"{content}{sep}{heading}\n\n{block}\n")


def plot_example(example: str, runs: Sequence[Run], path: Path) -> bool:
    """Held-out reward per seed over steps (dashed: without AIR) and, where logged, the training
    tool-error rate. Returns False (and says why) when there is nothing to plot or no matplotlib."""
    curves = [(r, held_out_curve(r.rows)) for r in runs]
    curves = [(r, c) for r, c in curves if c]
    if not curves:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print("matplotlib is not installed: no plot (uv sync --extra train)", file=sys.stderr)
        return False
    errors = [(r, tool_error_series(r.rows)) for r in runs]
    errors = [(r, e) for r, e in errors if e]
    fig, axes = plt.subplots(1, 2 if errors else 1, figsize=(11 if errors else 7, 4), squeeze=False)
    seeds = sorted({r.seed for r in runs})
    colors = {seed: f"C{i % 10}" for i, seed in enumerate(seeds)}

    def draw(ax: Any, series: list[tuple[Run, list[tuple[int, float]]]]) -> None:
        for r, points in series:
            steps, values = zip(*points, strict=True)
            style = "-" if r.air else "--"
            label = f"seed {r.seed}" + ("" if r.air else " without AIR")
            ax.plot(steps, values, style, marker="o", color=colors[r.seed], label=label)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    draw(axes[0][0], curves)
    n = {s for r in runs if (s := summary(r)["n_held_out"]) is not None}
    axes[0][0].set_ylabel(f"held-out reward ({'/'.join(map(str, sorted(n))) or '?'} tasks)")
    axes[0][0].set_title(f"examples/{example}: held-out reward")
    if errors:
        draw(axes[0][1], errors)
        axes[0][1].set_ylabel("tool-error rate (training rollouts)")
        axes[0][1].set_title("tool errors during training")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def render_and_write(
    payload: dict[str, Any], out: Path, *, examples: Sequence[str] | None, write_readmes: bool, root: Path
) -> str:
    """Plots into ``out/<name>/``, ``out/examples.md``; with ``write_readmes`` the READMEs and plots
    under ``root``. Returns the markdown."""
    header: dict[str, Any] = dict(payload["header"])
    if not out.resolve().is_relative_to(root):  # no machine's absolute path in a README: the run folder is <out>
        header["command"] = str(header["command"]).replace(str(out.resolve()), "<out>")
    runs = [Run(**r["run"]) for r in payload["runs"]]
    names = [n for n in (examples or payload.get("examples") or EXAMPLES) if any(r.example == n for r in runs)]
    parts: list[str] = []
    for name in names:
        mine = [r for r in runs if r.example == name]
        if any(r.arm for r in mine):  # the arms comparison (issue 42) has its own block
            text = render_arms(name, mine, header, payload.get("warm_starts", []))
            parts.append(f"## {name}: shared policy, frozen roles, per-role adapters\n\n" + text)
            if write_readmes:
                paste_block(root / "examples" / name / "README.md", text, ARMS_BEGIN, ARMS_END, "## Per-role adapters")
                begin, end = bench_markers(f"{name}_arms")
                bench = root / "benchmarks" / "README.md"
                paste_block(bench, text, begin, end, heading=f"### {name}: per-role adapters", after=BENCH_END_ANY)
            continue
        plotted = plot_example(name, mine, out / name / "learning.png")
        parts.append(f"## {name}\n\n" + render_example(name, mine, header, f"{name}/learning.png" if plotted else None))
        if write_readmes:
            example_dir = root / "examples" / name
            if plotted:
                shutil.copyfile(out / name / "learning.png", example_dir / "learning.png")
            paste_block(
                example_dir / "README.md", render_example(name, mine, header, "learning.png" if plotted else None)
            )
            begin, end = bench_markers(name)
            bench_text = render_example(name, mine, header, f"../examples/{name}/learning.png" if plotted else None)
            bench = root / "benchmarks" / "README.md"
            paste_block(bench, bench_text, begin, end, heading=f"### {name}", after=BENCH_END_ANY)
    text = "\n".join(parts)
    (out / "examples.md").write_text(text)
    return text


# --- running --------------------------------------------------------------------------------------


class _Live:
    """The processes in flight, so Ctrl-C ends the runs this script started and no others."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[bytes]] = set()

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.add(proc)

    def discard(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.discard(proc)

    def kill_all(self) -> None:
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the run's process group (the trainer and whatever it started), SIGKILL after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            if sig is signal.SIGKILL:
                return
        except subprocess.TimeoutExpired:
            continue


def train_command(
    root: Path, example: str, seed: int, run_dir: Path, air: bool, extra: Sequence[str], arm: str = ""
) -> list[str]:
    cmd = [sys.executable, str(root / "examples" / example / "train.py"), "--seed", str(seed)]
    cmd += ["--out", str(run_dir), "--quiet", *extra, *(ARMS[example][arm] if arm else [])]
    return cmd if air else [*cmd, "--tool-error-reward", "0"]


def _run_logged(
    cmd: list[str], root: Path, run_dir: Path, log_path: Path, threads: int, timeout_s: float, live: _Live
) -> tuple[int | None, float]:
    """``cmd`` in a fresh ``run_dir``, its output in ``log_path``, in its own process group (so a timeout
    ends its children too); (exit status or None when killed at ``timeout_s``, wall seconds)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    returncode: int | None
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        live.add(proc)
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
            returncode = None
        finally:
            live.discard(proc)
    return returncode, time.perf_counter() - started


@dataclass
class WarmStart:
    """The warm start an arms comparison shares between the arms of one (example, seed)."""

    example: str
    seed: int
    folder: str  # the HF folder the arms start from (--model)
    command: list[str]
    wall_s: float
    error: str | None = None
    resumed: bool = False


def make_warm_start(
    root: Path,
    example: str,
    seed: int,
    out: Path,
    threads: int,
    extra: Sequence[str],
    timeout_s: float,
    live: _Live,
    resume: bool = False,
) -> WarmStart:
    """``train.py --warm-only`` once per (example, seed), so that every arm of the seed starts from the same
    weights and its wall time is its RL phase; ``--resume`` reuses one that an earlier invocation saved."""
    run_dir = out / example / f"seed{seed}-warm"
    folder, log_path = run_dir / "warm_start", out / example / f"seed{seed}-warm.log"
    cmd = train_command(root, example, seed, run_dir, True, [*extra, "--warm-only"])
    shown = _shown(cmd, root)
    if resume and (folder / "warm_start.json").exists() and log_path.exists():
        return WarmStart(example, seed, str(folder), shown, _log_wall_s(log_path) or 0.0, resumed=True)
    returncode, wall = _run_logged(cmd, root, run_dir, log_path, threads, timeout_s, live)
    warm = WarmStart(example, seed, str(folder), shown, wall)
    if returncode != 0 or not (folder / "warm_start.json").exists():
        warm.error = f"warm start {'timed out' if returncode is None else f'exit {returncode}'}, see {log_path}"
    return warm


def _run_name(seed: int, air: bool, arm: str) -> str:
    return f"seed{seed}" + ("" if air else "-noair") + (f"-{arm}" if arm else "")


def checker_verdicts(store_path: Path) -> dict[str, dict[str, int]]:
    """The SQL checker's verdicts per training step, read from the run's store: ``{step: {"CORRECT": n,
    "WRONG": n, "other": n}}`` (``CORRECT`` anywhere in the reply, as the graph reads it; ``WRONG`` at
    its start; anything else, a reply that is neither). Steps come from the rollout ids (``-s<step>-``)."""
    import sqlite3

    out: dict[str, dict[str, int]] = {}
    if not store_path.exists():
        return out
    con = sqlite3.connect(f"file:{store_path}?mode=ro", uri=True)
    try:
        for rollout_id, data in con.execute("SELECT rollout_id, data FROM spans WHERE name = 'llm.call'"):
            step = re.search(r"-s(\d+)-", rollout_id)
            attrs = json.loads(data).get("attributes", {})
            if step is None or attrs.get("lightning.role") != "checker":
                continue
            text = str(attrs.get("lightning.response_text") or "").strip().upper()
            kind = "CORRECT" if "CORRECT" in text else ("WRONG" if text.startswith("WRONG") else "other")
            counts = out.setdefault(step[1], {"CORRECT": 0, "WRONG": 0, "other": 0})
            counts[kind] += 1
    finally:
        con.close()
    return out


def _shown(cmd: Sequence[str], root: Path) -> list[str]:
    """The command as the report prints it: paths inside the checkout relative to it."""
    return [
        Path(cmd[0]).name,
        *(str(Path(c).relative_to(root)) if Path(c).is_relative_to(root) else c for c in cmd[1:]),
    ]


def _log_wall_s(log_path: Path) -> float | None:
    """Seconds from the run log's creation (the process start: it is opened then) to its last write (the
    process end), from the file system's birth time (``stat -c %W``; None where it keeps none)."""
    try:
        born = float(subprocess.run(["stat", "-c", "%W", str(log_path)], capture_output=True, text=True).stdout)
    except (OSError, ValueError):
        return None
    return log_path.stat().st_mtime - born if born > 0 else None


def resumed_run(
    root: Path, example: str, seed: int, air: bool, out: Path, extra: Sequence[str], arm: str = ""
) -> Run | None:
    """A run an earlier invocation finished (``--resume``): its folder's metrics and its log's
    wall time; None when it did not finish (no complete metrics, or no birth time to time it by)."""
    name = _run_name(seed, air, arm)
    run_dir, log_path = out / example / name, out / example / f"{name}.log"
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists() or not log_path.exists() or "held-out reward:" not in log_path.read_text():
        return None
    wall = _log_wall_s(log_path)
    if wall is None:
        return None
    cmd = _shown(train_command(root, example, seed, run_dir, air, extra, arm), root)
    run = Run(example, seed, air, cmd, 0, wall, arm=arm)
    run.log, run.resumed = str(log_path), True
    if arm and example == "sql_agent":
        run.verdicts = checker_verdicts(run_dir / "store.sqlite")
    run.rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    warm = run_dir / "warm_start" / "warm_start.json"
    run.warm_start = json.loads(warm.read_text()) if warm.exists() else None
    return run if len(held_out_curve(run.rows)) >= 2 else None


def run_one(
    root: Path,
    example: str,
    seed: int,
    air: bool,
    out: Path,
    threads: int,
    extra: Sequence[str],
    timeout_s: float,
    live: _Live,
    arm: str = "",
) -> Run:
    """One ``train.py`` in a fresh process (own process group, so a timeout ends its children too)."""
    name = _run_name(seed, air, arm)
    run_dir = out / example / name
    log_path = out / example / f"{name}.log"
    cmd = train_command(root, example, seed, run_dir, air, extra, arm)
    returncode, wall = _run_logged(cmd, root, run_dir, log_path, threads, timeout_s, live)
    shown = _shown(cmd, root)
    run = Run(example, seed, air, shown, returncode, wall, log=str(log_path), arm=arm)
    if arm and example == "sql_agent":
        run.verdicts = checker_verdicts(run_dir / "store.sqlite")
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        run.rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    warm = run_dir / "warm_start" / "warm_start.json"
    if warm.exists():
        run.warm_start = json.loads(warm.read_text())
    if returncode is None:
        run.error = f"timed out after {timeout_s / 60:g} min"
    elif returncode != 0:
        run.error = f"exit {returncode}, see {log_path}"
    elif len(held_out_curve(run.rows)) < 2:
        run.error = f"metrics.jsonl has {len(held_out_curve(run.rows))} held-out row(s), expected before and after"
    return run


def _parse_extra(values: Sequence[str] | None, examples: Sequence[str]) -> dict[str, list[str]]:
    """``NAME="--flag v"`` for one example, a bare ``"--flag v"`` for all; repeatable."""
    extra: dict[str, list[str]] = {name: [] for name in examples}
    for value in values or []:
        m = re.match(r"^(\w+)=(.*)$", value, re.S)
        if m and m[1] in EXAMPLES:
            if m[1] in extra:
                extra[m[1]] += shlex.split(m[2])
        elif m:
            raise SystemExit(f"--extra-args {value!r}: {m[1]!r} is no example; use one of {', '.join(EXAMPLES)}")
        else:
            for name in extra:
                extra[name] += shlex.split(value)
    return extra


def _names(text: str, what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXAMPLES]
    if unknown:
        raise SystemExit(f"{what} {', '.join(unknown)}: not an example; use names from {', '.join(EXAMPLES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", default=None, help=f"comma-separated (default: {','.join(EXAMPLES)})")
    ap.add_argument("--seeds", default="0,1,2", help="seeds: 0-2 or 0,1,2")
    ap.add_argument(
        "--air-ablation",
        default=",".join(DEFAULT_ABLATION),
        help="examples also run with --tool-error-reward 0, same seeds ('' for none)",
    )
    ap.add_argument(
        "--arms",
        default="",
        help="issue 42: run each seed once per arm of shared,frozen,per_role (sql_agent and rag_agent only; "
        "no AIR ablation)",
    )
    ap.add_argument("--parallel", type=int, default=1, help="example runs at once (wall times then not comparable)")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS per run (default: cores // --parallel)")
    ap.add_argument("--out", default="runs/bench_examples", help="folder for the runs, results.json, plots, markdown")
    ap.add_argument(
        "--extra-args",
        action="append",
        metavar='[NAME=]"ARGS"',
        help='more train.py arguments: NAME="--steps 2" for one example, "--steps 2" for all (repeatable)',
    )
    ap.add_argument("--timeout-min", type=float, default=15.0, help="a run still going after this is killed and failed")
    ap.add_argument("--write-readmes", action="store_true", help="paste the blocks and plots into the READMEs")
    ap.add_argument("--paste", metavar="RESULTS_JSON", help="run nothing: render this earlier results.json")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs an interrupted invocation with the same --out finished (wall time: their log's "
        "creation to last write); run the rest",
    )
    ap.add_argument(
        "--collect",
        action="store_true",
        help="with --resume: run nothing more; the runs not finished are reported as such",
    )
    ap.add_argument("--repo-root", default=str(REPO), help=argparse.SUPPRESS)  # the tests' copy of the READMEs
    args = ap.parse_args(argv)
    if args.collect and not args.resume:
        raise SystemExit("--collect reads what an earlier invocation finished: use it with --resume")
    root = Path(args.repo_root).resolve()
    chosen = _names(args.examples, "--examples") if args.examples else None

    if args.paste:
        source = Path(args.paste)
        payload = json.loads(source.read_text())
        print(render_and_write(payload, source.parent, examples=chosen, write_readmes=args.write_readmes, root=root))
        return 0

    examples = chosen or list(EXAMPLES)
    ablation = _names(args.air_ablation, "--air-ablation")
    if args.parallel < 1:
        raise SystemExit("--parallel must be >= 1")
    cores = os.cpu_count() or 1
    threads = args.threads or max(1, cores // args.parallel)
    seeds = parse_seeds(args.seeds)
    extra = _parse_extra(args.extra_args, examples)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    argv_text = shlex.join(sys.argv[1:] if argv is None else argv)
    header: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "command": f"uv run python benchmarks/examples.py {argv_text}".strip(),
        "machine": f"{cpu_name()}, {cores} cores, Python {platform.python_version()}",
        "threads": threads,
        "parallel": args.parallel,
        "threads_note": f"{args.parallel} run(s) at once, OMP_NUM_THREADS={threads} each",
    }
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if arms:
        bad = [n for n in examples if n not in ARMS] + [a for a in arms if a not in ARMS["sql_agent"]]
        if bad:
            raise SystemExit(f"--arms runs {', '.join(ARMS)} with arms {', '.join(ARMS['sql_agent'])}; not {bad}")
        ablation = []
    plan: list[tuple[str, int, bool, str]] = [
        (name, seed, True, arm) for name in examples for arm in (arms or [""]) for seed in seeds
    ]
    plan += [(name, seed, False, "") for name in examples if name in ablation for seed in seeds]
    total = len(plan)
    live = _Live()
    print(f"{total} runs: {', '.join(examples)} x seeds {seeds}; without AIR too: {', '.join(ablation) or 'none'}")
    print(header_line(header), flush=True)

    # the arms of one (example, seed) start from one warm start, made first: their wall time is the RL phase
    warm_starts: dict[tuple[str, int], WarmStart] = {}

    def warm(name: str, seed: int) -> WarmStart:
        tag = f"{name} seed {seed}: warm start"
        if args.collect and not (out / name / f"seed{seed}-warm" / "warm_start" / "warm_start.json").exists():
            print(f"{tag} not finished (--collect)", flush=True)
            return WarmStart(name, seed, "", [], 0.0, error="not finished: the benchmark was stopped before it ended")
        print(f"{tag} started", flush=True)
        w = make_warm_start(root, name, seed, out, threads, extra[name], args.timeout_min * 60, live, args.resume)
        print(f"{tag} ... {w.error or 'done'} in {w.wall_s / 60:.1f} min", flush=True)
        return w

    def run_extra(name: str, seed: int, arm: str) -> list[str]:
        w = warm_starts.get((name, seed)) if arm else None
        return [*extra[name], "--model", w.folder, "--warm-start-steps", "0"] if w else extra[name]

    def one(index: int, name: str, seed: int, air: bool, arm: str) -> Run:
        tag = f"[{index}/{total}] {name} seed {seed}" + ("" if air else " without AIR") + (f" ({arm})" if arm else "")
        w = warm_starts.get((name, seed)) if arm else None
        if w is not None and w.error:
            return Run(name, seed, air, [], None, 0.0, error=w.error, arm=arm)
        done = resumed_run(root, name, seed, air, out, run_extra(name, seed, arm), arm) if args.resume else None
        if done is not None:
            print(f"{tag} finished earlier (--resume): {done.wall_s / 60:.1f} min", flush=True)
            return done
        if args.collect:
            run = Run(
                name, seed, air, [], None, 0.0, error="not finished: the benchmark was stopped before it ended", arm=arm
            )
            print(f"{tag} not finished (--collect)", flush=True)
            return run
        print(f"{tag} started", flush=True)
        r = run_one(root, name, seed, air, out, threads, run_extra(name, seed, arm), args.timeout_min * 60, live, arm)
        s = summary(r)
        result = f"gain {s['gain']:+.2f} ({s['before']:.2f} -> {s['after']:.2f})" if s["ok"] else f"FAILED: {r.error}"
        print(f"{tag} ... {result} in {r.wall_s / 60:.1f} min", flush=True)
        return r

    started = time.perf_counter()
    runs: list[Run] = []
    try:
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            pairs = sorted({(name, seed) for name, seed, _, arm in plan if arm})
            for w in pool.map(lambda pair: warm(*pair), pairs):
                warm_starts[(w.example, w.seed)] = w
            futures: list[Future[Run]] = [pool.submit(one, i, *item) for i, item in enumerate(plan, 1)]
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=120, return_when=FIRST_COMPLETED)
                if pending:
                    minutes = (time.perf_counter() - started) / 60
                    print(f"  ... {total - len(pending)}/{total} done after {minutes:.1f} min", flush=True)
            runs = [f.result() for f in futures]
    except KeyboardInterrupt:
        live.kill_all()
        raise
    payload: dict[str, Any] = {
        "header": header,
        "examples": examples,
        "seeds": seeds,
        "arms": arms,
        "air_ablation": ablation,
        "targets": {"gain": TARGET_GAIN, "held_out_tasks": TARGET_TASKS, "seeds": TARGET_SEEDS, "minutes": LIMIT_MIN},
        "runs": [{"run": asdict(r), "summary": summary(r)} for r in runs],
        "warm_starts": [asdict(w) for w in warm_starts.values()],
    }
    (out / "results.json").write_text(json.dumps(payload, indent=1))
    failed = [r for r in runs if r.error]
    print(render_and_write(payload, out, examples=examples, write_readmes=args.write_readmes and not failed, root=root))
    print(f"results: {out / 'results.json'}, {out / 'examples.md'}")
    if failed:
        print(f"{len(failed)} run(s) failed: {'; '.join(f'{r.label}: {r.error}' for r in failed)}", file=sys.stderr)
        if args.write_readmes:
            print(
                f"READMEs left alone; to paste anyway: --paste {out / 'results.json'} --write-readmes", file=sys.stderr
            )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
