"""AutoGen plugin tests: telemetry off before AutoGen is imported, and helpers to build agents and teams.

Every test runs real AutoGen agents and teams against the real gateway (``GatewayHarness``); the
only double is the scripted upstream standing in for vLLM. ``reply`` scripts it from the request
body, so concurrent rollouts each get answers that follow their own conversation.
"""

from __future__ import annotations

import os

for _name, _value in {
    "ANONYMIZED_TELEMETRY": "False",
    "LANGSMITH_TRACING": "false",
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
}.items():
    os.environ.setdefault(_name, _value)
