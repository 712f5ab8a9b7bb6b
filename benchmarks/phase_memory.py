"""Per-step peak resident memory of each phase of finished runs, side by side (from their metrics.jsonl).

The trainer logs ``mem/<phase>_peak_gb`` for every phase of every step (``lightning_rl.memory.
PeakMemory``): ``rollouts``, ``update``, ``publish`` (the adapters merged into the engine: the
lowest phase of a step, so it shows the floor a step starts from) and ``validation``. A run's single
peak hides whether memory creeps up from step to step or one phase jumps; this prints, for each
run given as ``label=run_dir``, one row per phase and one column per step.

A "phase" ``step_end/<kind>`` prints instead what the memory left after the step's trim was made
of (``mem/step_end/<kind>_gb``, ``lightning_rl.memory.memory_breakdown``): ``malloc_in_use`` for
memory malloc handed out and has not had back, ``other_anonymous``, ``malloc_free``, ``resident``.

    uv run python benchmarks/phase_memory.py default=<out>/seed0 capped=<out2>/seed0 [--phases rollouts,update]
    uv run python benchmarks/phase_memory.py a=<run> --phases publish,step_end/malloc_in_use
    uv run python benchmarks/phase_memory.py a=<run> --times

``--times`` adds where each run's training time went: its rollouts and updates summed over steps (the
updates that also measured the KL to the start, ``kl_every``, apart), and the training time the
trainer logged at the last step (``train/elapsed_s``: held-out evaluations excluded). A demo's wall
time minus that is its model load, warm start and held-out evaluations.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import generated_line

__all__ = ["main", "phase_peaks", "phase_seconds"]


def phase_peaks(metrics: Path, phase: str) -> dict[int, float]:
    """``{step: peak GB}`` of ``phase`` in a run's metrics.jsonl (the largest, if a step logged it
    twice); for ``step_end/<kind>``, that kind's GB at the step's end."""
    key = f"mem/{phase}_gb" if phase.startswith("step_end/") else f"mem/{phase}_peak_gb"
    peaks: dict[int, float] = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if key in record and "step" in record:
            step = int(record["step"])
            peaks[step] = max(peaks.get(step, 0.0), float(record[key]))
    return peaks


def phase_seconds(metrics: Path) -> dict[str, float]:
    """Seconds a run's steps spent in rollouts and updates (summed), in the updates that measured the
    KL to the start, and its training time at the last step (``train/elapsed_s``), with the steps."""
    out = {"rollouts": 0.0, "updates": 0.0, "kl_updates": 0.0, "training": 0.0, "steps": 0.0}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if "train/update_s" not in record:
            continue
        out["rollouts"] += float(record.get("train/rollout_s", 0.0))
        out["updates"] += float(record["train/update_s"])
        if "train/kl_to_start" in record:
            out["kl_updates"] += float(record["train/update_s"])
        out["training"] = max(out["training"], float(record.get("train/elapsed_s", 0.0)))
        out["steps"] += 1
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="label=run_dir (a folder holding metrics.jsonl)")
    parser.add_argument("--phases", default="publish,rollouts,update", help="comma-separated phase names")
    parser.add_argument("--times", action="store_true", help="also print the seconds of rollouts and updates")
    args = parser.parse_args(argv)
    runs: list[tuple[str, Path]] = []
    for item in args.runs:
        label, sep, folder = item.partition("=")
        if not sep or not label or not folder:
            parser.error(f"expected label=run_dir, got {item!r}")
        metrics = Path(folder) / "metrics.jsonl"
        if not metrics.is_file():
            parser.error(f"{metrics} does not exist: give the folder of a finished or running run")
        runs.append((label, metrics))
    table = {(label, phase): phase_peaks(metrics, phase) for label, metrics in runs for phase in args.phases.split(",")}
    steps = sorted({step for peaks in table.values() for step in peaks})
    print(generated_line("phase_memory.py", argv, "read from the runs' metrics.jsonl"))
    print("\nPeak resident memory (GB) of each phase (step_end/*: the memory a step left, by kind), per step\n")
    print("| run | phase | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("|---|---|" + "---:|" * len(steps))
    for (label, phase), peaks in table.items():
        cells = " | ".join(f"{peaks[s]:.2f}" if s in peaks else "" for s in steps)
        print(f"| {label} | {phase} | {cells} |")
    if args.times:
        print(
            "\nSeconds of each run's RL steps (training time: rollouts, updates and publishes; evaluations excluded)\n"
        )
        print("| run | steps | rollouts | updates | of them, updates measuring the KL | training time |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, metrics in runs:
            t = phase_seconds(metrics)
            print(
                f"| {label} | {t['steps']:.0f} | {t['rollouts']:.0f} s | {t['updates']:.0f} s | "
                f"{t['kl_updates']:.0f} s | {t['training']:.0f} s |"
            )


if __name__ == "__main__":
    main()
