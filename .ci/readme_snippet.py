"""Run the first ``python`` block of a package README, as a newcomer would paste it.

Usage: ``python .ci/readme_snippet.py PLUGIN README.md`` inside a venv where the plugin was
installed from its wheel with its framework extra. A snippet names the user's own objects (a
graph, a team); the prelude below builds small real ones with the framework itself, none of which
calls a model, so the snippet runs offline. Top-level ``await`` is allowed (the AutoGen snippet
uses it). Afterwards the plugin is checked to be instrumented and uninstrumented again.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any

for var, value in {
    "LANGSMITH_TRACING": "false",
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
    "ANONYMIZED_TELEMETRY": "False",
    "OPENAI_AGENTS_DISABLE_TRACING": "0",
}.items():
    os.environ.setdefault(var, value)

PRELUDE = {
    "langchain": """
from typing import TypedDict
from langgraph.graph import END, START, StateGraph
class _State(TypedDict):
    n: int
_g = StateGraph(_State)
_g.add_node("writer", lambda s: {"n": s["n"] + 1})
_g.add_edge(START, "writer")
_g.add_edge("writer", END)
graph = _g.compile()
inputs = {"n": 0}
""",
    "autogen": """
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.replay import ReplayChatCompletionClient
solver = AssistantAgent("solver", model_client=ReplayChatCompletionClient(["4"]))
reviewer = AssistantAgent("reviewer", model_client=ReplayChatCompletionClient(["looks right"]))
stop = MaxMessageTermination(3)
question = "What is 2 + 2?"
""",
    "openai-agents": "",
    "crewai": "",
}

CHECK = {
    "langchain": "from lightning_langchain import LangChainInstrumentor as I\nassert I().is_instrumented\n"
    "assert graph.invoke(inputs) == {'n': 1}\nI().uninstrument()",
    "autogen": "assert [m.source for m in result.messages] == ['user', 'solver', 'reviewer'], result.messages",
    "openai-agents": "from lightning_openai_agents import OpenAIAgentsInstrumentor as I\nassert I().is_instrumented\n"
    "I().uninstrument()",
    "crewai": "from lightning_crewai import CrewAIInstrumentor as I\nassert I().is_instrumented\nI().uninstrument()",
}


def first_python_block(readme: Path) -> str:
    match = re.search(r"```python\n(.*?)```", readme.read_text(), re.S)
    if match is None:
        raise SystemExit(f"{readme}: no ```python block")
    return match.group(1)


def main() -> int:
    plugin, readme = sys.argv[1], Path(sys.argv[2])
    snippet = first_python_block(readme)
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    source = PRELUDE[plugin] + "\n" + snippet + "\n" + CHECK[plugin] + "\n"

    async def together() -> None:  # one event loop for the snippet and the check (AutoGen's await)
        code = compile(source, "<README snippet>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(code, namespace)  # noqa: S307 - the project's own README
        if inspect.iscoroutine(result):
            await result

    asyncio.run(together())
    print(f"== {plugin}: README snippet ran ({len(snippet.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
