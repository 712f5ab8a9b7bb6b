"""First contact: a missing extra is one line naming the pip command; ``--version``; the agent side stays light.

The absent package is simulated in a child interpreter with ``sys.modules[name] = None`` (Python's
own way of making an import fail with ``ModuleNotFoundError``); ``.ci/wheels`` repeats the checks
in fresh virtual environments built from the wheels, where the packages are really absent.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from lightning_rl.errors import MissingExtraError
from lightning_rl.extras import CORE_EXTRAS, extra_import, install_command, missing_modules, require_extra

ROOT = Path(__file__).resolve().parents[2]


def _child(code: str, *blocked: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``blocked`` modules cannot be imported."""
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120, check=False
    )


def test_core_extras_table_matches_pyproject() -> None:
    declared = tomllib.loads((ROOT / "packages/core/pyproject.toml").read_text())["project"]["optional-dependencies"]
    # verl has its own loader and message (backends/verl/_require.py); every other extra is in the table,
    # so a feature that needs it can say which pip command to run (add a new extra to CORE_EXTRAS).
    assert set(CORE_EXTRAS) == set(declared) - {"verl"}


def test_require_extra_names_the_pip_command() -> None:
    with pytest.raises(MissingExtraError, match=r"^x needs no_such_module_xyz \(not installed\): pip install "):
        CORE_EXTRAS["_test"] = ("no_such_module_xyz",)
        try:
            require_extra("_test", feature="x")
        finally:
            del CORE_EXTRAS["_test"]
    require_extra("server", "train", feature="the dev environment has these")  # no error
    assert install_command(["server", "train"]) == "pip install 'lightning-rl[server,train]'"
    assert missing_modules(["json", "no_such_module_xyz.sub"]) == ["no_such_module_xyz.sub"]


def test_extra_import_rewrites_only_the_extras_modules() -> None:
    with pytest.raises(MissingExtraError, match=r"^f \(no_such_module_xyz is not installed\): pip install z$") as err:
        with extra_import("pip install z", "f", ["no_such_module_xyz"]):
            import no_such_module_xyz  # noqa: F401  # pyright: ignore[reportMissingImports]
    assert isinstance(err.value, ImportError) and err.value.name == "no_such_module_xyz"
    assert isinstance(err.value.__cause__, ModuleNotFoundError)
    with pytest.raises(ModuleNotFoundError):  # another module's absence is a bug to see as it is
        with extra_import("pip install z", "f", ["something_else"]):
            import no_such_module_xyz  # noqa: F401  # pyright: ignore[reportMissingImports]


@pytest.mark.parametrize(
    ("argv", "blocked", "expected"),
    [
        (["gateway", "serve", "--upstream-url", "http://127.0.0.1:9"], "uvicorn", "pip install 'lightning-rl[server]'"),
        (["gateway", "serve", "--model", "tiny"], "torch", "pip install 'lightning-rl[train]'"),
        (["demo"], "torch", "pip install 'lightning-rl[train]'"),
        (["store", "serve", "--port", "0"], "fastapi", "pip install 'lightning-rl[server]'"),
    ],
)
def test_cli_without_an_extra_prints_one_line_naming_it(argv: list[str], blocked: str, expected: str) -> None:
    out = _child(f"from lightning_rl.cli import main\nraise SystemExit(main({argv!r}))", blocked)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lightning-rl: error: ") and expected in lines[0], out.stderr
    assert blocked in lines[0]


def test_trainer_import_without_torch_names_the_train_extra() -> None:
    out = _child("from lightning_rl import Trainer", "torch")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == (
        "lightning_rl.errors.MissingExtraError: Trainer needs the train extra (torch is not installed): "
        "pip install 'lightning-rl[train]'"
    )


def test_version_flag_prints_the_installed_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lightning_rl.cli", "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == f"lightning-rl {metadata.version('lightning-rl')}"


AGENT_SIDE = [
    "lightning_rl",
    "lightning_rl.runner",
    "lightning_rl.tracing",
    "lightning_rl.plugins",
    "lightning_rl.store.client",
    "lightning_rl.cli",
]


@pytest.mark.parametrize("module", AGENT_SIDE)
def test_agent_side_imports_pay_for_no_training_stack(module: str) -> None:
    # `from lightning_rl import Trainer` loads torch (seconds); a runner or an agent must not.
    heavy = ("torch", "transformers", "numpy", "fastapi", "uvicorn")
    out = _child(f"import {module}\nprint(sorted(m for m in {heavy!r} if m in sys.modules))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
