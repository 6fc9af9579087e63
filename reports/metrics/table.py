"""The result of one evaluation: per-query values, labelled negatives apart, aggregates with their counts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ubi_pipeline.reports.metrics.names import MetricError, MetricSpec


class Aggregate(NamedTuple):
    """Mean of one metric and the number of queries it rests on (``mean`` is None when ``n`` is 0)."""

    mean: float | None
    n: int


def _mean(values: np.ndarray) -> float | None:
    # fsum is correctly rounded, so the mean does not depend on the order of the queries.
    return math.fsum(values.tolist()) / values.size if values.size else None


@dataclass(frozen=True)
class MetricTable:
    """Values of each requested metric for one run against one set of judgments.

    ``values[name]`` is aligned with ``query_ids``: the run's queries that have at least one positive
    judgment (grade >= ``rel_threshold``). Labelled negatives (judged, no positive: the right answer is
    "nothing") are listed in ``negative_query_ids`` with what is defined for them: how many docs the run
    returned (``negative_retrieved``) and every judged@k (``negative_values``). They never enter a mean.
    ``unjudged_query_ids``: run queries with no judgments (not evaluated, as in trec_eval).
    ``missing_query_ids``: judged queries the run lacks (scored as empty rankings only when ``complete``).
    """

    specs: tuple[MetricSpec, ...]
    query_ids: tuple[str, ...]
    values: dict[str, np.ndarray]
    negative_query_ids: tuple[str, ...]
    negative_retrieved: np.ndarray
    negative_values: dict[str, np.ndarray]
    unjudged_query_ids: tuple[str, ...]
    missing_query_ids: tuple[str, ...]
    gain: str
    rel_threshold: int
    complete: bool
    condensed: bool = False

    @property
    def metrics(self) -> tuple[str, ...]:
        """Metric names in request order."""
        return tuple(s.name for s in self.specs)

    @property
    def n_queries(self) -> int:
        """Queries every aggregate rests on."""
        return len(self.query_ids)

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.values[name.strip().lower()]
        except KeyError:
            raise MetricError(f"metric {name!r} was not computed; computed: {', '.join(self.metrics)}") from None

    def aggregate(self) -> dict[str, Aggregate]:
        """Mean of every metric over the evaluated queries, with the count it rests on."""
        return {name: Aggregate(_mean(self.values[name]), self.n_queries) for name in self.metrics}

    def negatives_aggregate(self) -> dict[str, Aggregate]:
        """Means over the labelled negatives of what is defined there (``retrieved`` and judged@k)."""
        n = len(self.negative_query_ids)
        out = {"retrieved": Aggregate(_mean(self.negative_retrieved.astype(np.float64)), n)}
        out.update({name: Aggregate(_mean(v), n) for name, v in self.negative_values.items()})
        return out

    def per_query(self) -> list[dict[str, Any]]:
        """One row per evaluated query: ``{"query_id": ..., metric: value, ...}``."""
        columns = [(name, self.values[name].tolist()) for name in self.metrics]
        return [
            {"query_id": query_id, **{name: col[i] for name, col in columns}}
            for i, query_id in enumerate(self.query_ids)
        ]

    def negatives_per_query(self) -> list[dict[str, Any]]:
        """One row per labelled negative: docs retrieved and judged@k."""
        retrieved = self.negative_retrieved.tolist()
        columns = [(name, v.tolist()) for name, v in self.negative_values.items()]
        return [
            {"query_id": query_id, "retrieved": retrieved[i], **{name: col[i] for name, col in columns}}
            for i, query_id in enumerate(self.negative_query_ids)
        ]

    def as_dict(self, *, per_query: bool = False) -> dict[str, Any]:
        """Everything as plain JSON-ready data (per-query rows when asked)."""
        out: dict[str, Any] = {
            "metrics": {s.name: {"description": s.describe(), "measure": s.measure, "k": s.k, "gain": s.gain}
                        for s in self.specs},
            "gain": self.gain,
            "rel_threshold": self.rel_threshold,
            "complete": self.complete,
            "condensed": self.condensed,
            "aggregate": {name: agg._asdict() for name, agg in self.aggregate().items()},
            "queries_evaluated": self.n_queries,
            "labelled_negatives": {
                "count": len(self.negative_query_ids),
                "query_ids": list(self.negative_query_ids),
                "aggregate": {name: agg._asdict() for name, agg in self.negatives_aggregate().items()},
            },
            "unjudged_run_queries": {"count": len(self.unjudged_query_ids), "query_ids": list(self.unjudged_query_ids)},
            "judged_queries_missing_from_run": {
                "count": len(self.missing_query_ids), "query_ids": list(self.missing_query_ids),
                "scored_as_empty": self.complete,
            },
        }
        if per_query:
            out["per_query"] = self.per_query()
            out["labelled_negatives"]["per_query"] = self.negatives_per_query()
        return out
