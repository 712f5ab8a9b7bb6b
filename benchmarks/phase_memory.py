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
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import generated_line

__all__ = ["main", "phase_peaks"]


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="label=run_dir (a folder holding metrics.jsonl)")
    parser.add_argument("--phases", default="publish,rollouts,update", help="comma-separated phase names")
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


if __name__ == "__main__":
    main()
