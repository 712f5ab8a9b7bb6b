"""``lightning-rl demo``: train the built-in calculator agent on the tiny model, on a CPU."""

from __future__ import annotations

__all__: list[str] = []
