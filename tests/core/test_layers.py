"""The house's floors: no module of ``lightning_rl`` imports a module on a higher floor.

Why a test: the structure drawing once showed arrows running back up (the VeRL backend importing the
training loop that uses backends, the demo reaching into trainer internals; issue 27). Such an arrow
makes the lower floor unusable without the higher one and invites import cycles, and nobody notices
it in review because each import looks harmless where it is written. The table below *is* the
layering: each entry is a module prefix and its floor; the longest matching prefix decides. Every
import counts, also the ones inside functions (lazy imports still tie the floors together) and under
``TYPE_CHECKING``. Imports within one floor are allowed; a new module needs no entry when its package
already has one.

The floors, lowest first, and why each sits where it does:

0. foundations: errors, types, span names, extras, credentials, role selection, the HTTP serving
   helpers, the OpenAPI document builder and what core reads from a LangChain run;
1. the store, the span carriers that feed it (``spans``: the batching writer the gateway, tracing and
   the runner share, and the OTLP decoder the store server uses), the engine (generation), credit
   assignment and the rollout-as-one-sequence builder (``sequences``) (pure functions on rewards and
   transitions);
2. the gateway (serves the engine or an upstream, writes spans to the store);
3. the agent-side ``LLM`` handle (points at a gateway);
4. what records agents: tracing, capture, the plugins' shared core;
5. what reads and runs rollouts: the adapter and the runner;
6. training backends (update weights, publish them to a gateway) and the dashboard (reads the store);
7. the algorithms' shared interface (``algorithms.base``: Algorithm, TrainResult, the registry), the
   preference pair builder (``algorithms.pairs``: pure functions, shared by DPO and the export), the
   transcript renderer (``algorithms.apo_render``: spans -> text, shared by APO and the judge) and the
   judge rewards (``rewards``: scores a group's rendered rollouts; the loop calls it);
8. the training loop (``trainer``);
9. the algorithms built on the loop (SFT, DPO, APO), VeRL's trainer, and the exports to other trainers
   (``export``: reads the store through the adapter, builds pairs, uploads to hosted fine-tuning);
10. the demo (uses the public trainer API);
11. entry points: the CLIs, ``lightning_rl.testing`` and the package's lazy facade.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "packages" / "core" / "src"

FLOORS: dict[str, int] = {
    "lightning_rl.errors": 0,
    "lightning_rl.types": 0,
    "lightning_rl.semconv": 0,
    "lightning_rl.extras": 0,
    "lightning_rl.memory": 0,
    "lightning_rl.seeding": 0,
    "lightning_rl.credentials": 0,
    "lightning_rl.roles": 0,
    "lightning_rl._serving": 0,
    "lightning_rl._openapi": 0,
    "lightning_rl.langchain_runs": 0,
    "lightning_rl.store": 1,
    "lightning_rl.spans": 1,
    "lightning_rl.engine": 1,
    "lightning_rl.credit": 1,
    "lightning_rl.sequences": 1,
    "lightning_rl.gateway": 2,
    "lightning_rl.agent": 3,
    "lightning_rl.tracing": 4,
    "lightning_rl.capture": 4,
    "lightning_rl.plugins": 4,
    "lightning_rl.adapter": 5,
    "lightning_rl.runner": 5,
    "lightning_rl.backends": 6,
    "lightning_rl.dashboard": 6,
    "lightning_rl.algorithms.base": 7,
    "lightning_rl.algorithms.pairs": 7,
    "lightning_rl.algorithms.apo_render": 7,
    "lightning_rl.rewards": 7,
    "lightning_rl.trainer": 8,
    "lightning_rl.algorithms": 9,
    "lightning_rl.trainer.verl": 9,
    "lightning_rl.export": 9,
    "lightning_rl.demo": 10,
    "lightning_rl.cli": 11,
    "lightning_rl.testing": 11,
    "lightning_rl.trainer._cli": 11,
    "lightning_rl.trainer.run_file": 11,
    "lightning_rl.gateway._cli": 11,
    "lightning_rl.store._cli": 11,
    "lightning_rl.runner._cli": 11,
    "lightning_rl.dashboard._cli": 11,
    "lightning_rl.plugins._cli": 11,
    "lightning_rl.export._cli": 11,
    "lightning_rl": 11,
}
"""Module prefix -> floor; the longest matching prefix wins (``lightning_rl`` alone is the facade)."""


def floor_of(module: str) -> int:
    """The floor of ``module``: the entry of its longest prefix in ``FLOORS``."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in FLOORS:
            return FLOORS[prefix]
    raise KeyError(f"{module} is outside lightning_rl: no floor")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted((SRC / "lightning_rl").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every ``lightning_rl`` import in ``path``, lazy ones included.

    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module and of ``pkg``
    otherwise (the name is then defined or re-exported by the package)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    known = _MODULES
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((node.lineno, sub if sub in known else target))
    return [(line, name) for line, name in out if name == "lightning_rl" or name.startswith("lightning_rl.")]


_MODULES = _modules()


def test_every_module_has_a_floor() -> None:
    for module in _MODULES:
        floor_of(module)  # raises for a module no entry covers


def test_the_table_names_only_modules_that_exist() -> None:
    stale = [prefix for prefix in FLOORS if not any(m == prefix or m.startswith(prefix + ".") for m in _MODULES)]
    assert not stale, f"floors for modules that no longer exist (remove them): {stale}"


@pytest.mark.parametrize("module", sorted(_MODULES))
def test_no_import_runs_up_a_floor(module: str) -> None:
    path = _MODULES[module]
    mine = floor_of(module)
    upward = sorted(
        {
            f"{path.relative_to(SRC)}:{line} imports {target} (floor {floor_of(target)} > {mine})"
            for line, target in _imports(module, path)
            if floor_of(target) > mine
        }
    )
    assert not upward, "an import runs up a floor (see this file's docstring):\n" + "\n".join(upward)


def test_the_check_sees_a_lazy_upward_import(tmp_path: Path) -> None:
    """The check itself: an import inside a function of a backend that names the trainer is found."""
    source = tmp_path / "x.py"
    source.write_text("def f():\n    from lightning_rl.trainer.loop import Trainer\n    return Trainer\n")
    found = _imports("lightning_rl.backends.x", source)
    assert found == [(2, "lightning_rl.trainer.loop")]
    assert floor_of("lightning_rl.trainer.loop") > floor_of("lightning_rl.backends.x")


def test_the_demo_uses_public_names_only() -> None:
    """The demo is what a user's training script looks like: no private module or name of another package."""
    private: list[str] = []
    for module, path in _MODULES.items():
        if not module.startswith("lightning_rl.demo"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module is None:
                continue
            source = node.module
            if not source.startswith("lightning_rl.") or source.startswith("lightning_rl.demo"):
                continue
            names = [source, *(f"{source}.{alias.name}" for alias in node.names)]
            private += [f"{module}:{node.lineno} {n}" for n in names if any(p.startswith("_") for p in n.split("."))]
    assert not private, f"the demo imports private names: {private}"
