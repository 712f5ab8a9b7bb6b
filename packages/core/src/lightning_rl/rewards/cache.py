"""A disk cache of judged groups: the same group, rubric and judge model are never paid for twice.

Judge calls cost money and minutes; a resumed run, a rerun with another seed of the learner, or a
benchmark repeated after a crash meets many groups it has already judged. The key is a SHA-256 of
everything that determines the answer: the rendered trajectories in their canonical (rollout)
order, the rubric, the judge's model and base URL, the prompt and the number of passes. Each entry
is one small JSON file, written to a temporary name and renamed, so a crash never leaves half an
entry, and concurrent runs sharing a folder at worst both write the same value.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

__all__ = ["JudgeCache", "cache_key"]

log = logging.getLogger(__name__)


def cache_key(trajectories: Sequence[str], *, rubric: str, model: str, base_url: str, prompt: str, passes: int) -> str:
    """The hex SHA-256 naming one judged group (see the module docstring for what it covers)."""
    blob = json.dumps(
        {
            "v": 1,
            "trajectories": list(trajectories),
            "rubric": rubric,
            "model": model,
            "base_url": base_url,
            "prompt": prompt,
            "passes": passes,
        },
        ensure_ascii=False,
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class JudgeCache:
    """Scores of judged groups, one JSON file per key under ``folder`` (created on the first write)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str, n: int) -> list[float] | None:
        """The cached scores of ``key`` (exactly ``n`` of them), or None (absent or unreadable: a miss)."""
        path = self._path(key)
        try:
            data: Any = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("judge cache entry %s is unreadable (%s); judging again", path, exc)
            return None
        scores = cast(dict[str, Any], data).get("scores") if isinstance(data, dict) else None
        if not isinstance(scores, list) or len(cast(list[Any], scores)) != n:
            return None
        return [float(s) for s in cast(list[Any], scores)]

    def put(self, key: str, scores: Sequence[float], **extra: Any) -> None:
        """Store ``scores`` (and ``extra`` for a person reading the file) under ``key``, atomically."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"scores": list(scores), **extra}, ensure_ascii=False))
        tmp.replace(path)
