"""CrewAI plugin tests: CrewAI telemetry, tracing and version checks off before CrewAI is imported (no network).

CrewAI is imported here once, with the one ``ImportWarning`` its lazy ``crewai.rag`` module raises
on import silenced (the suite turns warnings into errors); the test modules then find it loaded.
"""

from __future__ import annotations

import os
import tempfile
import warnings

for _name, _value in {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
    "ANONYMIZED_TELEMETRY": "False",
    "LANGSMITH_TRACING": "false",
    "CREWAI_STORAGE_DIR": os.path.join(tempfile.gettempdir(), "lightning-crewai-tests"),
}.items():
    os.environ.setdefault(_name, _value)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Cannot set an attribute on 'crewai", category=ImportWarning)
    import crewai  # noqa: F401  # pyright: ignore[reportUnusedImport]
