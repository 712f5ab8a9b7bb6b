"""``lightning-rl inspect``: the dashboard's views rendered with rich in a terminal."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from lightning_rl.dashboard._settings import find_run_dir, load_credit_settings
from lightning_rl.dashboard.index import RolloutFilter, RolloutIndex, RolloutSummary
from lightning_rl.dashboard.views import rollout_detail
from lightning_rl.errors import NotFoundError
from lightning_rl.store import open_store
from lightning_rl.store.base import LightningStore

__all__ = ["run_inspect", "rollouts_table", "render_rollout", "transitions_table"]

_STATUS_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "timed_out": "yellow",
    "cancelled": "dim",
    "running": "cyan",
    "queued": "dim",
    "requeued": "magenta",
}
_CUT = 400


def _num(x: Any, fmt: str = "{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)


def _when(t: float | None) -> str:
    return "—" if t is None else datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S")


def rollouts_table(rows: list[RolloutSummary], title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    for name, just in (
        ("rollout", "left"),
        ("status", "left"),
        ("mode", "left"),
        ("reward", "right"),
        ("calls", "right"),
        ("tools", "right"),
        ("roles", "left"),
        ("model v", "left"),
        ("ended", "left"),
    ):
        table.add_column(name, justify=just)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(
            r.id,
            Text(r.status, style=_STATUS_STYLE.get(r.status, "")),
            r.mode,
            _num(r.reward),
            _num(r.n_calls, "{}"),
            _num(r.n_tool_calls, "{}"),
            ", ".join(r.roles) if r.roles else ("—" if r.roles is not None else "…"),
            ", ".join(map(str, r.model_versions)) if r.model_versions else "—",
            _when(r.ended_at),
        )
    return table


def _cut(text: str, full: bool) -> str:
    return text if full or len(text) <= _CUT else text[:_CUT] + f" … [{len(text) - _CUT} more chars; --full]"


def render_rollout(console: Console, detail: dict[str, Any], *, full: bool = False) -> None:
    """Attempts, span tree, calls, tools, signals and rewards of one rollout."""
    r = detail["rollout"]
    console.print(
        f"[bold]{r['id']}[/]  status [{_STATUS_STYLE.get(r['status'], '')}]{r['status']}[/]  mode {r['mode']}  "
        f"group {r['group_id']}  task {r['task']['id']}  reward [bold]{_num(detail['reward'])}[/]"
    )
    console.print(Text(f"task input: {_cut(str(r['task']['input']), full)}"))
    if r.get("error"):
        console.print(Text(f"error: {r['error']}", style="red"))
    for view in detail["attempts"]:
        a = view["attempt"]
        tree = Tree(
            f"attempt {a['number']} ({a['id']}) worker {a['worker_id']}: {a['status']}"
            + (f" — {a['error']}" if a.get("error") else "")
        )
        nodes: list[Tree] = [tree]
        for s in view["spans"]:
            depth = s["depth"]
            del nodes[depth + 1 :]
            label = Text(f"{s['name']}", style="bold" if s["name"] == "llm.call" else "")
            label.append(f"  +{s['start_ms']:.0f} ms, {s['duration_ms']:.0f} ms", style="dim")
            if s.get("role"):
                label.append(f"  role={s['role']}", style="cyan")
            if s["status"] == "error":
                label.append(f"  ERROR {s.get('status_message') or ''}", style="red")
            nodes.append(nodes[-1].add(label))
        console.print(tree)
        for i, c in enumerate(view["calls"]):
            head = (
                f"[bold]call {i}[/] role={c['role'] or '—'} model v{c['model_version']} "
                + (f"adapter {c['adapter']} v{c['adapter_version']} " if c.get("adapter") else "")
                + f"prompt {c['prompt_tokens']} tok, response {c['response_tokens']} tok, "
                f"{'exact' if c['exact_tokens'] else '[yellow]INEXACT[/]'} tokens, "
                f"finish {','.join(map(str, c['finish_reasons']))}"
            )
            console.print(head)
            for m in c["prompt"]:
                console.print(Text(f"  [{m['role']}] {_cut(m['content'], full)}", style="dim"))
            console.print(Text(f"  → {_cut(c['response_text'], full)}"))
            for tc in c["tool_calls"]:
                console.print(
                    Text(f"  tool call {tc.get('id')}: {tc.get('name')}({tc.get('arguments')})", style="cyan")
                )
        for t in view["tools"]:
            style = "red" if t["status"] == "error" else "green"
            console.print(Text(f"tool {t['tool']} [{t['tool_call_id']}] {t['status']} {t['error'] or ''}", style=style))
        for s in view["signals"]:
            console.print(Text(f"signal {s['name']} = {s['value']} (tool call {s['tool_call_id']}, role {s['role']})"))
        for rw in view["rewards"]:
            console.print(Text(f"emit_reward {rw['value']} at +{rw['start_ms']:.0f} ms"))


def transitions_table(credit: dict[str, Any]) -> Table:
    st = credit["settings"]
    title = (
        f"transitions — credit {st['credit']} (γ={st['gamma']}), {st['estimator']}, AIR {st['air'] or 'none'}; "
        f"from {st['source']}"
    )
    table = Table(title=title, title_justify="left")
    for name in (
        "call",
        "role",
        "trainable",
        "AIR reward",
        "return",
        "advantage",
        "in update",
        "tokens (p/r)",
        "flags",
    ):
        table.add_column(name)
    for row in credit["rows"]:
        flags = [f for f, on in (("inexact", not row["exact_tokens"]), ("truncated", row["truncated"])) if on]
        table.add_row(
            str(row["call_index"]),
            row["role"] or "—",
            Text("yes", style="green") if row["trainable"] else Text("no", style="dim"),
            _num(row["air_reward"]),
            _num(row["return"]),
            _num(row["advantage"]),
            "yes" if row["in_update"] else "no",
            f"{row['prompt_tokens']}/{row['response_tokens']}",
            ", ".join(flags),
        )
    return table


def _print_credit(console: Console, credit: dict[str, Any]) -> None:
    console.print(transitions_table(credit))
    console.print(f"final reward: {_num(credit.get('final_reward'))}")
    if credit.get("note"):
        console.print(f"[yellow]{credit['note']}[/]")
    group = credit.get("group")
    if group:
        rewards = ", ".join(_num(g["reward"], "{:.2f}") for g in group["rollouts"])
        console.print(
            f"group {group['id']}: rewards [{rewards}], this rollout's advantage {group['rollout_advantage']:.3f}"
        )
    for s in credit.get("unattached_signals", []):
        console.print(f"[yellow]signal {s['name']} attached to no call (no matching tool-call id or earlier call)[/]")


async def _tail(console: Console, index: RolloutIndex, store: LightningStore, interval: float, last: int) -> None:
    await index.refresh(force=True)
    shown: set[str] = set()
    ended = [r for r in index.rows if r.ended_at is not None]
    backlog = ended[-last:] if last > 0 else []
    for r in ended:
        shown.add(r.id)
    for r in backlog:
        await index.index_spans(r)
    if backlog:
        console.print(rollouts_table(backlog, f"last {len(backlog)} ended rollouts"))
    console.print(f"[dim]following {index.store.__class__.__name__}; Ctrl-C to stop[/]")
    while True:
        await asyncio.sleep(interval)
        await index.refresh(force=True)
        fresh = [r for r in index.rows if r.ended_at is not None and r.id not in shown]
        fresh.sort(key=lambda r: r.ended_at or 0.0)
        for r in fresh:
            shown.add(r.id)
            await index.index_spans(r)
            console.print(
                f"{_when(r.ended_at)} {r.id} [{_STATUS_STYLE.get(r.status, '')}]{r.status}[/] {r.mode} "
                f"reward {_num(r.reward)} calls {_num(r.n_calls, '{}')} tools {_num(r.n_tool_calls, '{}')}"
                + (f" [red]{r.error}[/]" if r.error else "")
            )


async def run_inspect(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run one ``inspect`` view; returns the exit code."""
    console = console or Console()
    run = args.run if args.run is not None else find_run_dir(args.store)
    settings = load_credit_settings(run)
    store = await open_store(args.store, token=args.store_token or os.environ.get("LIGHTNING_STORE_TOKEN"))
    try:
        view = args.inspect_command
        if view == "rollouts":
            index = RolloutIndex(store)
            flt = RolloutFilter(
                status=frozenset(s for item in args.status for s in item.split(",") if s),
                mode=args.mode,
                reward_min=args.reward_min,
                reward_max=args.reward_max,
                model_version=args.model_version,
                role=args.role,
                q=args.search,
            )
            await index.refresh(force=True)
            if flt.role is not None or flt.model_version is not None or flt.q is not None:
                for row in index.rows:  # those filters read spans: read them all (the terminal has no background)
                    if row.roles is None and row.ended_at is not None:
                        await index.index_spans(row)
            page = await index.page(flt, limit=args.limit, offset=args.offset)
            for row in page.rows:
                if row.roles is None and row.ended_at is not None:
                    await index.index_spans(row)
            shown = f"{page.offset + 1}-{page.offset + len(page.rows)}" if page.rows else "none"
            console.print(
                rollouts_table(page.rows, f"rollouts {shown} of {page.total} matching ({page.known} in store)")
            )
        elif view == "rollout":
            detail = await rollout_detail(store, args.rollout_id, settings)
            render_rollout(console, detail, full=args.full)
            _print_credit(console, detail["credit"])
        elif view == "transitions":
            detail = await rollout_detail(store, args.rollout_id, settings)
            _print_credit(console, detail["credit"])
        else:
            await _tail(console, RolloutIndex(store), store, args.interval, args.last)
    except NotFoundError as exc:
        console.print(f"[red]lightning-rl inspect: {exc}[/] (list ids with: lightning-rl inspect rollouts --store …)")
        return 1
    finally:
        await store.close()
    return 0
