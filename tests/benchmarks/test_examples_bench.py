"""benchmarks/examples.py: the tables, verdicts and README blocks it renders, and how it runs and
records train.py processes.

A real example run takes minutes (a 1-step calc_agent run took over 2 minutes on the 2 loaded
cores this was written on), so nothing here trains. The rendering is tested on a synthetic
``results.json`` written below (the fixture: the figures in it are made up), and the runner on
fixture ``train.py`` scripts in a temporary repository root that follow the examples' command-line
contract: one learns, one hangs (killed at the timeout), one exits with an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

from .conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "examples.py"
BEGIN, END = "<!-- benchmarks/examples.py:begin -->", "<!-- benchmarks/examples.py:end -->"


def _module() -> ModuleType:
    return load_benchmark("examples")


def _rows(before: float, after: float, n_val: int, errors: list[float], *, seed: int) -> list[dict[str, Any]]:
    """metrics.jsonl rows as the trainer writes them: validation at step 0 and after the last step,
    training rows with per-role keys (the solver trains, the writer is frozen)."""

    def val(step: int, reward: float, solver_errors: float) -> dict[str, Any]:
        row = {"step": float(step), "val/reward_mean": reward, "val/n_rollouts": float(n_val)}
        row |= {"val/role/solver/calls": 20.0, "val/role/solver/tool_error_rate": solver_errors}
        return row | {"val/role/writer/calls": 20.0, "val/role/writer/tool_error_rate": 0.0}

    rows: list[dict[str, Any]] = [val(0, before, errors[0])]
    for step, err in enumerate(errors, 1):
        rows.append(
            {
                "step": float(step),
                "train/reward_mean": before + (after - before) * step / len(errors),
                "train/role/solver/calls": 10.0,
                "train/role/solver/trained_transitions": 8.0,
                "train/role/solver/air_mean": -0.1 * err,
                "train/role/solver/tool_error_rate": err,
                "train/role/solver/tool_call_rate": 0.5 + 0.1 * step,
                "train/role/solver/weights_version": float(step - 1),
                "train/role/writer/calls": 4.0,
                "train/role/writer/trained_transitions": 0.0,
                "train/role/writer/air_mean": float("nan"),
                "train/role/writer/tool_error_rate": float("nan"),
                "train/role/writer/weights_version": 0.0,  # served frozen
                "seed": seed,
            }
        )
    rows.append(val(len(errors), after, errors[-1]))
    return rows


def _run(example: str, seed: int, air: bool, rows: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    run = {"example": example, "seed": seed, "air": air, "command": ["python", "train.py"], "returncode": 0}
    run |= {"wall_s": 240.0 + seed, "error": None, "log": "", "rows": rows, "warm_start": None}
    return {"run": run | kw}


def _payload() -> dict[str, Any]:
    runs = [_run("calc_agent", s, True, _rows(0.1, 0.55 + 0.1 * s, 120, [0.4, 0.3, 0.1], seed=s)) for s in range(3)]
    runs += [_run("calc_agent", s, False, _rows(0.1, 0.3, 120, [0.4, 0.4, 0.35], seed=s)) for s in range(3)]
    runs += [
        _run("crew_agent", 0, True, _rows(0.2, 0.3, 8, [0.2, 0.2], seed=0), wall_s=700.0),
        _run("crew_agent", 1, True, [], returncode=1, error="exit 1, see crew.log"),
    ]
    header = {
        "date": "2000-01-01 00:00 UTC",
        "commit": "fixture",
        "command": "uv run python benchmarks/examples.py --fixture",
        "machine": "a test CPU, 2 cores, Python 3",
        "threads": 2,
        "parallel": 1,
        "threads_note": "1 run(s) at once, OMP_NUM_THREADS=2 each",
    }
    return {"header": header, "examples": ["calc_agent", "crew_agent"], "runs": runs}


def _fake_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for name in ("calc_agent", "crew_agent"):
        (root / "examples" / name).mkdir(parents=True)
    (root / "benchmarks").mkdir()
    (root / "examples" / "calc_agent" / "README.md").write_text(
        f"# Calc\n\nintro\n\n{BEGIN}\nold numbers\n{END}\n\nafter\n"
    )
    (root / "examples" / "crew_agent" / "README.md").write_text("# Crew\n\nno markers here\n")
    (root / "benchmarks" / "README.md").write_text(
        "# Benchmarks\n\n## Examples\n\n### calc_agent\n\n<!-- benchmarks/examples.py:calc_agent:begin -->\n"
        "<!-- benchmarks/examples.py:calc_agent:end -->\n\n## Next section\n"
    )
    return root


def _script(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The script in a subprocess; the timeout is only a safety net (a saturated 2-core machine took over 50 s)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def test_summary_and_verdict_from_rows() -> None:
    m = _module()
    payload = _payload()
    runs = [m.Run(**r["run"]) for r in payload["runs"]]
    s = m.summary(runs[0])
    assert (s["before"], s["after"], s["n_held_out"]) == (0.1, 0.55, 120)
    assert abs(s["gain"] - 0.45) < 1e-9
    assert (s["tool_error_first"], s["tool_error_last"], s["first_step"], s["last_step"]) == (0.4, 0.1, 1, 3)
    # held-out: the per-role rates weighted by calls (the writer's 20 calls had no errors)
    assert (s["val_tool_error_before"], s["val_tool_error_after"]) == (0.2, 0.05)
    solver, writer = s["roles"]["solver"], s["roles"]["writer"]
    assert solver["calls"] == 30 and solver["trained_transitions"] == 24
    assert abs(solver["air_mean"] - (-0.1 * (0.4 + 0.3 + 0.1) / 3)) < 1e-9
    assert writer["trained_transitions"] == 0 and writer["air_mean"] is None  # NaN = no data, not a value
    assert m.verdict(runs[:3]) == (True, [])
    met, misses = m.verdict([r for r in runs if r.example == "crew_agent"])
    assert not met
    text = "; ".join(misses)
    assert "seed(s) 1 did not finish" in text and "1 seed(s) finished" in text
    assert "gain below +0.3 (+0.10)" in text and "8 held-out tasks" in text and "over 10 min (11.7 min)" in text


def test_paste_renders_tables_and_writes_readmes(tmp_path: Path) -> None:
    root = _fake_repo(tmp_path)
    results = tmp_path / "out" / "results.json"
    results.parent.mkdir()
    results.write_text(json.dumps(_payload()))
    proc = _script("--paste", str(results), "--write-readmes", "--repo-root", str(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "out" / "examples.md").read_text()
    assert md.strip() in proc.stdout
    assert (
        "Generated 2000-01-01 00:00 UTC at commit `fixture` by `uv run python benchmarks/examples.py --fixture`" in md
    )
    assert "| 0 | 0.10 | 0.55 | **+0.45** | 4.0 min | 120 |" in md
    assert "mean **+0.55**, min **+0.45**" in md
    assert "): **met**." in md  # calc_agent
    assert "**not met**: seed(s) 1 did not finish" in md  # crew_agent
    assert "| 1 | — | — | **failed**: exit 1, see crew.log |" in md
    assert "| solver | yes | 30 | 24 | -0.027 | 0.40 → 0.10 | 0.60 → 0.80 | 0 → 2 |" in md
    assert "| writer | no | 12 | 0 | — | — | — | 0 → 0 |" in md
    assert "| 2 | off | 0.10 | 0.30 | +0.20 | 0.40 → 0.35 | 0.20 → 0.17 |" in md
    assert (
        "with AIR mean gain **+0.55** (min +0.45), tool-error rate at the last step 0.10, held-out after training "
        "0.05; without mean gain **+0.20** (min +0.20), tool-error rate at the last step 0.35, held-out after"
    ) in md

    calc = (root / "examples" / "calc_agent" / "README.md").read_text()
    assert calc.startswith("# Calc\n\nintro\n\n" + BEGIN) and calc.endswith(END + "\n\nafter\n")
    assert "old numbers" not in calc and "**+0.45**" in calc and "](learning.png)" in calc
    assert (root / "examples" / "calc_agent" / "learning.png").stat().st_size > 1000
    assert (tmp_path / "out" / "calc_agent" / "learning.png").exists()
    crew = (root / "examples" / "crew_agent" / "README.md").read_text()
    assert crew.startswith("# Crew\n\nno markers here\n\n## Measured\n\n" + BEGIN) and crew.endswith(END + "\n")
    bench = (root / "benchmarks" / "README.md").read_text()
    assert "](../examples/calc_agent/learning.png)" in bench and bench.endswith("## Next section\n")
    assert bench.index("### calc_agent") < bench.index("**+0.45**") < bench.index("## Next section")
    # crew_agent had no block yet: it goes after the last example block, still inside the section
    assert bench.index("examples.py:calc_agent:end") < bench.index("### crew_agent\n\n<!-- benchmarks/examples.py:crew")

    before = {p: p.read_text() for p in root.rglob("*.md")}
    again = _script("--paste", str(results), "--write-readmes", "--repo-root", str(root), "--examples", "calc_agent")
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.read_text() for p in root.rglob("*.md")} == before  # pasting is idempotent
    assert "## crew_agent" not in again.stdout


FIXTURE_TRAIN = '''
"""Fixture for tests/benchmarks/test_examples_bench.py: follows the examples' train.py contract."""
import argparse, json, os, pathlib, sys, time
p = argparse.ArgumentParser()
p.add_argument("--seed", type=int); p.add_argument("--out"); p.add_argument("--quiet", action="store_true")
p.add_argument("--tool-error-reward", type=float, default=-0.1); p.add_argument("--bonus", type=float, default=0.0)
a = p.parse_args()
if MODE == "hang":
    time.sleep(120)
if MODE == "crash":
    sys.exit(2)
out = pathlib.Path(a.out); (out / "warm_start").mkdir(parents=True)
(out / "warm_start" / "warm_start.json").write_text(json.dumps({"steps": 3}))
after = 0.4 + a.bonus + (0.1 if a.tool_error_reward else 0.0) + 0.01 * a.seed
rows = [{"step": 0, "val/reward_mean": 0.05, "val/n_rollouts": 100, "omp": os.environ["OMP_NUM_THREADS"]},
        {"step": 1, "train/reward_mean": 0.3, "train/tool_error_rate": 0.5},
        {"step": 2, "train/reward_mean": 0.4, "train/tool_error_rate": 0.2 if a.tool_error_reward else 0.45},
        {"step": 2, "val/reward_mean": after, "val/n_rollouts": 100}]
(out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
'''


def test_runs_record_success_timeout_and_crash(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    for name, mode in (("calc_agent", "learn"), ("crew_agent", "hang"), ("sql_agent", "crash")):
        (root / "examples" / name).mkdir(parents=True)
        (root / "examples" / name / "train.py").write_text(f"MODE = {mode!r}\n" + textwrap.dedent(FIXTURE_TRAIN))
        (root / "examples" / name / "README.md").write_text("untouched\n")
    out = tmp_path / "out"
    args = ["--examples", "calc_agent,crew_agent,sql_agent", "--seeds", "0-1", "--air-ablation", "calc_agent"]
    args += ["--parallel", "2", "--threads", "1", "--timeout-min", "0.05", "--out", str(out), "--write-readmes"]
    args += ["--extra-args", "calc_agent=--bonus 0.2", "--repo-root", str(root)]
    proc = _script(*args)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # two examples failed
    assert "READMEs left alone" in proc.stderr
    assert all((root / "examples" / n / "README.md").read_text() == "untouched\n" for n in ("calc_agent", "sql_agent"))
    assert "[1/8] calc_agent seed 0 ... gain +0.65 (0.05 -> 0.70) in " in proc.stdout
    assert "calc_agent seed 1 without AIR ... gain +0.56 (0.05 -> 0.61)" in proc.stdout

    payload = json.loads((out / "results.json").read_text())
    runs = {(r["run"]["example"], r["run"]["seed"], r["run"]["air"]): r for r in payload["runs"]}
    assert len(runs) == 8 and payload["header"]["threads_note"] == "2 run(s) at once, OMP_NUM_THREADS=1 each"
    calc = runs[("calc_agent", 0, True)]
    assert calc["run"]["rows"][0]["omp"] == "1" and calc["run"]["warm_start"] == {"steps": 3}
    assert calc["run"]["command"][1:] == [
        "examples/calc_agent/train.py", "--seed", "0", "--out", str(out / "calc_agent" / "seed0"), "--quiet",
        "--bonus", "0.2",
    ]  # fmt: skip
    assert runs[("calc_agent", 0, False)]["run"]["command"][-2:] == ["--tool-error-reward", "0"]
    assert calc["summary"]["tool_error_first"] == 0.5 and calc["summary"]["tool_error_last"] == 0.2
    hung = runs[("crew_agent", 1, True)]["run"]
    assert hung["returncode"] is None and hung["error"] == "timed out after 0.05 min" and hung["wall_s"] < 100
    crashed = runs[("sql_agent", 0, True)]["run"]
    assert crashed["returncode"] == 2 and crashed["error"].startswith("exit 2, see ")
    md = (out / "examples.md").read_text()
    assert (
        "| 1 | on | 0.05 | 0.71 | +0.66 | 0.50 → 0.20 | — |" in md
        and "| 1 | off | 0.05 | 0.61 | +0.56 | 0.50 → 0.45 | — |" in md
    )
    assert "**failed**: timed out" in md and "2 seed(s) finished, the target needs 3" in md


def test_resume_keeps_finished_runs_and_paths_beside_the_checkout_are_shown_whole(tmp_path: Path) -> None:
    """An out folder whose path starts like the checkout's (``repo_runs`` beside ``repo``) once crashed the
    report after every run had finished; ``--resume`` then keeps those runs instead of training again."""
    root = tmp_path / "repo"
    (root / "examples" / "calc_agent").mkdir(parents=True)
    counting = 'pathlib.Path(a.out + ".count").open("a").write("x")\nprint("held-out reward: 0.05 -> 0.5")\n'
    train = "MODE = 'learn'\n" + textwrap.dedent(FIXTURE_TRAIN) + counting
    (root / "examples" / "calc_agent" / "train.py").write_text(train)
    out = tmp_path / "repo_runs"
    args = [
        "--examples",
        "calc_agent",
        "--seeds",
        "0",
        "--air-ablation",
        "",
        "--out",
        str(out),
        "--repo-root",
        str(root),
    ]
    first = _script(*args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    command = json.loads((out / "results.json").read_text())["runs"][0]["run"]["command"]
    assert command[4:6] == ["--out", str(out / "calc_agent" / "seed0")]
    again = _script(*args, "--resume")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (out / "calc_agent" / "seed0.count").read_text() == "x"  # trained once only
    run = json.loads((out / "results.json").read_text())["runs"][0]["run"]
    assert "finished earlier (--resume)" in again.stdout and run["resumed"] is True and 0 <= run["wall_s"] < 60
    assert "* finished by an earlier invocation" in (out / "examples.md").read_text()
    collected = _script(*[a if a != "0" else "0-1" for a in args], "--resume", "--collect")
    assert collected.returncode == 1 and (out / "calc_agent" / "seed0.count").read_text() == "x"
    assert "calc_agent seed 1 not finished (--collect)" in collected.stdout
    assert not (out / "calc_agent" / "seed1").exists()  # nothing ran


def test_the_arms_table_shows_reward_frozen_role_drift_memory_and_wall_time(tmp_path: Path) -> None:
    """Issue 42's comparison: shared policy, frozen roles, per-role adapters, per seed and per arm."""
    bench = _module()
    store = tmp_path / "store.sqlite"
    import sqlite3

    con = sqlite3.connect(store)
    con.execute("CREATE TABLE spans (rollout_id TEXT, name TEXT, data TEXT)")
    replies = [("r-s1-t0-0", "CORRECT"), ("r-s1-t0-1", "WRONG: no."), ("r-s2-t0-0", "Correct"), ("r-s2-t1-0", "hm")]
    replies += [("r-v0-t0", "WRONG"), ("r-s2-t1-0", "SELECT 1")]  # a validation call; a writer's call
    for rollout, text in replies:
        role = "writer" if text.startswith("SELECT") else "checker"
        attrs = {"lightning.role": role, "lightning.response_text": text}
        con.execute("INSERT INTO spans VALUES (?, 'llm.call', ?)", (rollout, json.dumps({"attributes": attrs})))
    con.commit()
    con.close()
    verdicts = bench.checker_verdicts(store)
    assert verdicts == {"1": {"CORRECT": 1, "WRONG": 1, "other": 0}, "2": {"CORRECT": 1, "WRONG": 0, "other": 1}}

    header = _payload()["header"]
    runs = []
    for arm, mem, gain in (("shared", 2.0, 0.5), ("frozen", 2.6, 0.4), ("per_role", 1.5, 0.45)):
        rows = _rows(0.0, gain, 100, [0.5, 0.2], seed=0)
        rows[1]["mem/update_peak_gb"] = mem
        rows[2]["mem/rollouts_peak_gb"] = mem - 0.5
        runs.append(bench.Run("sql_agent", 0, True, ["python"], 0, 300.0, rows=rows, arm=arm, verdicts=verdicts))
    text = bench.render_arms("sql_agent", runs, header)
    assert "| shared | 0 | 0.00 | 0.50 | **+0.50** | 0.50 → 0.50 | 1/1/0 → 1/0/1 | 2.00 GB | 5.0 min |" in text
    assert "| per_role | 1 of 1 | **+0.45** | +0.45 | 1.50 GB |" in text
    assert text.index("| shared |") < text.index("| frozen |") < text.index("| per_role |")


ARMS_TRAIN = '''
"""Fixture: an example's train.py with the flags of the arms comparison; each warm start appends to a log."""
import argparse, json, pathlib
p = argparse.ArgumentParser()
p.add_argument("--seed", type=int); p.add_argument("--out"); p.add_argument("--quiet", action="store_true")
p.add_argument("--model", default="tiny"); p.add_argument("--warm-start-steps", type=int, default=100)
p.add_argument("--warm-only", action="store_true"); p.add_argument("--untrainable-roles", default="frozen")
p.add_argument("--adapters", default="shared"); p.add_argument("--tool-error-reward", type=float, default=-0.1)
a = p.parse_args()
out = pathlib.Path(a.out)
model = a.model
if a.model == "tiny" and a.warm_start_steps > 0:
    (out / "warm_start").mkdir(parents=True)
    (out / "warm_start" / "warm_start.json").write_text(json.dumps({"seed": a.seed}))
    with (out.parent / "warm_starts.log").open("a") as log:
        log.write(f"{a.seed}\\n")
    model = str(out / "warm_start")
if a.warm_only:
    print(f"warm start: {model}")
    raise SystemExit(0)
out.mkdir(parents=True, exist_ok=True)
gain = 0.5 if a.adapters == "per_role" else {"shared": 0.3, "frozen": 0.4}[a.untrainable_roles]
rows = [{"step": 0, "val/reward_mean": 0.1, "val/n_rollouts": 100, "model": model},
        {"step": 1, "train/reward_mean": 0.3, "mem/update_peak_gb": 1.0},
        {"step": 1, "val/reward_mean": 0.1 + gain, "val/n_rollouts": 100}]
(out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
print("held-out reward: done")
'''


def test_the_arms_of_a_seed_share_one_warm_start_and_time_their_rl_phase_alone(tmp_path: Path) -> None:
    """``--arms``: one ``--warm-only`` run per (example, seed); every arm starts from its folder with
    ``--warm-start-steps 0``; ``--resume`` reuses it; the table says what the warm starts took."""
    root = tmp_path / "repo"
    (root / "examples" / "rag_agent").mkdir(parents=True)
    (root / "examples" / "rag_agent" / "train.py").write_text(ARMS_TRAIN)
    out = tmp_path / "out"
    args = ["--examples", "rag_agent", "--arms", "shared,frozen,per_role", "--seeds", "0-1", "--out", str(out)]
    args += ["--repo-root", str(root)]
    proc = _script(*args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted((out / "rag_agent" / "warm_starts.log").read_text().split()) == ["0", "1"]  # once per seed
    payload = json.loads((out / "results.json").read_text())
    assert [(w["seed"], w["error"]) for w in payload["warm_starts"]] == [(0, None), (1, None)]
    for r in payload["runs"]:
        folder = str(out / "rag_agent" / f"seed{r['run']['seed']}-warm" / "warm_start")
        assert r["run"]["rows"][0]["model"] == folder
        assert r["run"]["command"][-6:-2] == ["--model", folder, "--warm-start-steps", "0"]
    md = (out / "examples.md").read_text()
    assert "| per_role | 2 of 2 | **+0.50** | +0.50 | 1.00 GB |" in md
    assert "Each seed's arms start from one warm start" in md and "Warm starts: seed 0 " in md

    again = _script(*args, "--resume")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert sorted((out / "rag_agent" / "warm_starts.log").read_text().split()) == ["0", "1"]  # none made again
    assert again.stdout.count("finished earlier (--resume)") == 6
