"""First contact with each plugin: without its framework, one line naming the pip command.

``import lightning_langchain`` / ``import lightning_autogen`` need their framework (the handler and
the wrappers subclass its classes), so their import says what to install; the OpenAI Agents SDK and
CrewAI plugins import without theirs and say it at ``instrument()``. The absence is simulated in a
child interpreter (``sys.modules[name] = None``); ``.ci/wheels`` repeats this in fresh venvs built
from the wheels, where the framework is really absent.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PLUGINS = [
    # (import name, a framework module to hide, what the user must be told to run)
    ("lightning_langchain", "langchain_core", "pip install 'lightning-langchain[langchain]'"),
    ("lightning_autogen", "autogen_agentchat", "pip install 'lightning-autogen[autogen]'"),
    ("lightning_openai_agents", "agents", "pip install 'lightning-openai-agents[openai-agents]'"),
    ("lightning_crewai", "crewai", "pip install 'lightning-crewai[crewai]'"),
]


def _child(code: str, blocked: str) -> subprocess.CompletedProcess[str]:
    prelude = f"import sys\nsys.modules[{blocked!r}] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(("module", "blocked", "command"), PLUGINS[:2])
def test_import_without_the_framework_names_the_extra(module: str, blocked: str, command: str) -> None:
    out = _child(f"import {module}", blocked)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("lightning_rl.errors.IncompatibleFrameworkError: ") and last.endswith(command), last
    assert f"({blocked} is not installed)" in last


@pytest.mark.parametrize(("module", "blocked", "command"), PLUGINS)
def test_instrument_without_the_framework_names_the_extra(module: str, blocked: str, command: str) -> None:
    # The distribution's metadata is what instrument() checks; point the plugin at one that is absent.
    pytest.importorskip(blocked)  # the plugin module itself must import here
    code = (
        f"import {module} as m\n"
        "from lightning_rl.plugins import load_plugin\n"
        f"cls = type(load_plugin({module.removeprefix('lightning_').replace('_', '-')!r}))\n"
        "cls.framework = 'no-such-distribution-xyz'\n"
        "try:\n    cls().instrument()\nexcept ImportError as e:\n    print(f'{type(e).__name__}: {e}')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("IncompatibleFrameworkError: ") and out.stdout.strip().endswith(command), out.stdout


def test_openai_agents_processor_without_the_sdk_names_the_extra() -> None:
    out = _child("from lightning_openai_agents import LightningTracingProcessor", "agents")
    last = out.stderr.strip().splitlines()[-1]
    assert last.endswith("pip install 'lightning-openai-agents[openai-agents]'"), last


def test_crewai_plugin_imports_without_crewai() -> None:
    out = _child("import lightning_crewai; print('ok')", "crewai")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
