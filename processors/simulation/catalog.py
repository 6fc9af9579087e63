"""The built-in catalog of the simulator: queries with graded candidate docs, deterministic from a seed.

Grades run 0..G (G = 3 by default: 0 = does not satisfy, 3 = exactly what was asked for). Texts are
readable product searches ("red running shoes") so that reports built on simulated traffic read well; doc
ids name their query (``red-running-shoes-07``) so a row of a report says what it is about.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.text import normalize_query


class SimulationError(UbiError):
    """A simulation was asked for with impossible settings (names the setting and the allowed range)."""


#: Fifty readable shop searches; larger catalogs add modifiers to them ("red running shoes for kids").
BASE_QUERIES: tuple[str, ...] = (
    "red running shoes", "wireless headphones", "usb c charger", "waterproof hiking boots",
    "stainless steel water bottle", "yoga mat", "mechanical keyboard", "noise cancelling earbuds",
    "leather wallet", "cast iron skillet", "coffee grinder", "led desk lamp", "phone case", "laptop backpack",
    "bluetooth speaker", "electric toothbrush", "winter jacket", "summer dress", "kids rain boots",
    "gaming mouse", "air fryer", "french press", "wool socks", "polarized sunglasses", "portable charger",
    "standing desk", "office chair", "hdmi cable", "printer toner", "instant camera", "large dog bed",
    "cat litter", "garden hose", "cordless drill", "bike helmet", "tennis racket", "family board games",
    "scented candles", "throw pillow covers", "bath towels", "memory foam pillow", "smart watch",
    "fitness tracker", "protein powder", "reading glasses", "baby stroller", "camping tent", "sleeping bag",
    "travel adapter", "kitchen knife set",
)
_MODIFIERS = ("for kids", "cheap", "black", "on sale", "large", "small", "best rated", "gift", "2 pack", "eco")

#: Share of candidate docs per grade 0..3 (most candidates of a search are weak, a few are exact).
DEFAULT_GRADE_SHARES = (0.4, 0.3, 0.2, 0.1)


@dataclass(frozen=True)
class Catalog:
    """Queries and their candidate docs with true grades: ``grades[q, j]`` is the grade of ``doc_ids[q, j]``."""

    query_ids: tuple[str, ...]
    query_texts: tuple[str, ...]
    doc_ids: NDArray[np.object_]  # [Q, D]
    grades: NDArray[np.int64]  # [Q, D], 0..max_grade
    max_grade: int

    @property
    def n_queries(self) -> int:
        return len(self.query_ids)

    @property
    def docs_per_query(self) -> int:
        return int(self.doc_ids.shape[1])

    def qrels(self) -> list[dict[str, Any]]:
        """Human judgments in the JSONL form of ``docs/metrics.md``: ``{"query_id", "query", "relevant"}``."""
        return [
            {"query_id": qid, "query": text,
             "relevant": {str(d): int(g) for d, g in zip(self.doc_ids[q], self.grades[q], strict=True)}}
            for q, (qid, text) in enumerate(zip(self.query_ids, self.query_texts, strict=True))
        ]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def query_texts(n: int) -> list[str]:
    """The first ``n`` texts: the fifty base searches, then base + modifier combinations."""
    if n <= len(BASE_QUERIES):
        return list(BASE_QUERIES[:n])
    texts = list(BASE_QUERIES)
    for modifier in _MODIFIERS:
        for base in BASE_QUERIES:
            texts.append(f"{base} {modifier}")
            if len(texts) == n:
                return texts
    # Beyond 550 searches, number them: large benches care about counts, not prose.
    texts.extend(f"{BASE_QUERIES[i % len(BASE_QUERIES)]} model {i}" for i in range(len(texts), n))
    return texts


def build_catalog(
    n_queries: int = 40,
    docs_per_query: int = 20,
    *,
    max_grade: int = 3,
    seed: int = 0,
    grade_shares: tuple[float, ...] | None = None,
) -> Catalog:
    """A catalog of ``n_queries`` searches with ``docs_per_query`` candidates each and grades 0..max_grade.

    Grades are drawn from ``grade_shares`` (default 40/30/20/10 % for grades 0..3); every query gets at least
    one doc of the top grade and one of grade 0, so each has something to find and something to avoid.
    """
    if n_queries < 1:
        raise SimulationError(f"queries must be at least 1, got {n_queries}")
    if docs_per_query < 2:
        raise SimulationError(f"docs per query must be at least 2, got {docs_per_query}")
    if max_grade < 1:
        raise SimulationError(f"max grade must be at least 1, got {max_grade}")
    shares = np.asarray(grade_shares if grade_shares is not None else
                        (DEFAULT_GRADE_SHARES if max_grade == 3 else np.ones(max_grade + 1)), dtype=float)
    if len(shares) != max_grade + 1 or (shares < 0).any() or shares.sum() <= 0:
        raise SimulationError(f"grade shares need {max_grade + 1} non-negative numbers, got {list(shares)}")
    rng = np.random.default_rng([seed, 0xCA7])
    grades = rng.choice(max_grade + 1, size=(n_queries, docs_per_query), p=shares / shares.sum())
    # Guarantee a top doc and a useless doc per query at random slots (slots carry no meaning).
    top_slot = rng.integers(docs_per_query, size=n_queries)
    low_slot = (top_slot + 1 + rng.integers(docs_per_query - 1, size=n_queries)) % docs_per_query
    rows = np.arange(n_queries)
    grades[rows, top_slot] = max_grade
    grades[rows, low_slot] = 0
    texts = query_texts(n_queries)
    width = len(str(docs_per_query))
    doc_ids = np.array([[f"{_slug(t)}-{j + 1:0{width}d}" for j in range(docs_per_query)] for t in texts],
                       dtype=object)
    query_ids = tuple(f"q{q + 1:0{len(str(n_queries))}d}" for q in range(n_queries))
    return Catalog(query_ids, tuple(texts), doc_ids, grades.astype(np.int64), max_grade)


def normalized_texts(catalog: Catalog) -> list[str]:
    """Query texts as the pipeline stores them for judgments (``normalize_query``)."""
    return [normalize_query(t) for t in catalog.query_texts]
