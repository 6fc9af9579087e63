"""Query sets for human reviewers, sampled from the logged queries.

The population is the normalised query texts of ``ubi_queries`` (empty texts left out), each with its
frequency: the number of distinct search instances (``query_id``) that searched it, so the sub-searches of a
multi-search count once. Strategies:

- ``top``: the N most frequent (ties: text order);
- ``random``: N texts uniformly at random without replacement (seeded);
- ``pptss``: probability proportional to frequency, without replacement: Efraimidis & Spirakis (2006),
  "Weighted random sampling with a reservoir", IPL 97:181: draw u_i ~ U(0, 1), key_i = u_i^(1/w_i), keep the
  N largest keys (computed as log(u_i) / w_i, which orders the same and does not underflow).

Every strategy returns exactly N texts when at least N distinct texts exist (else all of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import duckdb
import numpy as np

from ubi_pipeline.formats.qrels import QuerySet, QuerySetQuery
from ubi_pipeline.schemas.cli_names import STRATEGIES
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.text import normalize_query

Strategy = Literal["top", "random", "pptss"]


class QuerySetError(UbiError):
    """A query set that cannot be drawn (unknown strategy, size below 1, no logged query)."""


class SampledQuery(NamedTuple):
    """One query of a query set and its frequency in the logs."""

    query: str
    frequency: int


def query_frequencies(con: duckdb.DuckDBPyConnection, *, application: str | None = None) -> list[SampledQuery]:
    """Every distinct normalised query text with its number of search instances, most frequent first."""
    where = "WHERE application = $app" if application is not None else ""
    rows = con.execute(
        f"SELECT user_query, list(DISTINCT query_id) FROM ubi_queries {where} GROUP BY user_query",
        {"app": application} if application is not None else {},
    ).fetchall()
    ids: dict[str, set[str]] = {}
    for text, qids in rows:
        norm = normalize_query(text)
        if norm:
            ids.setdefault(norm, set()).update(qids)
    freq = [SampledQuery(q, len(s)) for q, s in ids.items()]
    return sorted(freq, key=lambda x: (-x.frequency, x.query))


def _es_keys(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    u = rng.random(len(weights))
    # log(u)/w orders like u^(1/w); u is in [0, 1): 0 maps to -inf (never picked first), as it should
    with np.errstate(divide="ignore"):
        return np.log(u) / weights


def sample(population: Sequence[SampledQuery], strategy: Strategy, size: int, *, seed: int = 0) -> list[SampledQuery]:
    """Draw ``size`` distinct queries from ``population`` (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise QuerySetError(f"strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    if size < 1:
        raise QuerySetError(f"size must be >= 1, got {size}")
    pop = sorted(population, key=lambda x: (-x.frequency, x.query))
    if not pop:
        raise QuerySetError("no logged query to sample from; ingest query records first")
    n = min(size, len(pop))
    if strategy == "top":
        return pop[:n]
    rng = np.random.default_rng(seed)
    if strategy == "random":
        idx = rng.choice(len(pop), size=n, replace=False)
        return [pop[i] for i in sorted(idx.tolist())]
    weights = np.array([q.frequency for q in pop], dtype=float)
    if (weights <= 0).any():
        raise QuerySetError("every query needs a positive frequency for pptss")
    keys = _es_keys(weights, rng)
    order = np.lexsort((np.arange(len(pop)), -keys))  # largest key first; index breaks exact ties
    return [pop[i] for i in sorted(order[:n].tolist())]


def to_queryset(queries: Sequence[SampledQuery], *, strategy: str, seed: int, name: str | None = None) -> QuerySet:
    """The sample as a :class:`ubi_pipeline.formats.qrels.QuerySet` (query id = the normalised text, unique in a sample).

    Written through :func:`ubi_pipeline.formats.qrels.format_queryset`: JSONL ``{"query_id", "query", "frequency"}`` or the
    Search Relevance Workbench import shape (as ``esci_us_queryset.json``), whose ``sampling`` is ``manual``
    because the set is given explicitly (the Workbench's own samplers are ``topn``, ``random``, ``pptss``);
    how it was drawn is in the description.
    """
    return QuerySet(
        tuple(QuerySetQuery(q.query, q.query, q.frequency) for q in queries),
        name=(name or f"ubi {strategy} {len(queries)}")[:50],
        description=f"{len(queries)} logged queries drawn by ubi queryset, strategy {strategy}, seed {seed}"[:250],
        sampling="manual",
    )
