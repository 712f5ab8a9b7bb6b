"""BM25 (Okapi) retrieval over the bundled corpus, in pure Python.

The paper's MuSiQue agent searches a Wikipedia index; at this scale a hundred paragraphs and an
exact BM25 ranking in a few lines do the same job with no index server and no embedding model.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

__all__ = ["BM25", "tokenize"]

_TOKEN = re.compile(r"[a-z0-9]+")
_STOP = frozenset("a an the of in is was for with its to which what who where does did and or".split())


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens without stop words (possessive ``'s`` dropped)."""
    return [t for t in _TOKEN.findall(text.lower().replace("'s", "")) if t not in _STOP]


class BM25:
    """An Okapi BM25 index over ``documents`` (``k1`` term saturation, ``b`` length normalisation)."""

    def __init__(self, documents: Sequence[str], *, k1: float = 1.5, b: float = 0.75) -> None:
        self.documents = list(documents)
        self.k1, self.b = k1, b
        self._tf = [Counter(tokenize(d)) for d in self.documents]
        self._len = [sum(tf.values()) for tf in self._tf]
        self._avg = sum(self._len) / max(len(self._len), 1)
        df: Counter[str] = Counter()
        for tf in self._tf:
            df.update(tf.keys())
        n = len(self.documents)
        self._idf = {term: math.log(1 + (n - f + 0.5) / (f + 0.5)) for term, f in df.items()}

    def scores(self, query: str) -> list[float]:
        """The BM25 score of every document for ``query``."""
        terms = tokenize(query)
        out: list[float] = []
        for tf, length in zip(self._tf, self._len, strict=True):
            norm = self.k1 * (1 - self.b + self.b * length / self._avg)
            out.append(sum(self._idf.get(t, 0.0) * tf[t] * (self.k1 + 1) / (tf[t] + norm) for t in terms if t in tf))
        return out

    def search(self, query: str, k: int = 2) -> list[str]:
        """The ``k`` best documents with a positive score, best first."""
        scored = sorted(enumerate(self.scores(query)), key=lambda p: (-p[1], p[0]))
        return [self.documents[i] for i, s in scored[:k] if s > 0]
