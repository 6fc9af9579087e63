"""Per-query metric rows in the shape the OpenSearch search-quality dashboards read.

The shape of ``sample_search_quality_evaluation_data.ndjson`` (user-behavior-insights): an OpenSearch
``_bulk`` body, an action line ``{"index": {"_index": ..., "_id": ...}}`` then a row
``{"datetime", "search_config", "query_set_id", "query", "metric", "value", "application", "evaluation_id"}``.
Here ``search_config`` is the system, ``application`` its application, ``query_set_id`` names the judgment
source (``logged:human``, ``logged:implicit:ctr``; ``run:human`` for a system read from a run file, whose
``application`` is null), ``evaluation_id`` is ``<system>_<report time>`` as in the
sample, and ``_id`` is a UUID derived from the row's identity, so loading the same report twice overwrites.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from ubi_pipeline.reports.joint import Report
from ubi_pipeline.schemas.systems import NO_APPLICATION

DEFAULT_INDEX = "sqe_metrics"
_NAMESPACE = uuid.UUID("6f1c3f2e-2b9e-4d3b-9a57-3c0f6f0c9a11")


def dashboard_rows(report: Report) -> list[dict[str, Any]]:
    """One row per (system, source, evaluated query, metric)."""
    when = report.created_at.replace(tzinfo=None)
    stamp = when.strftime("%Y-%m-%d %H:%M:%S")
    rows = []
    from_run = set(report.run_systems)
    for r in report.offline:
        # a run file's name is no application, and its queries come from the file, not the log
        app = NO_APPLICATION if r.system in from_run else r.system.split("/", 1)[0]
        query_set = f"{'run' if r.system in from_run else 'logged'}:{r.source}"
        evaluation = f"{r.system}_{stamp}"
        for i, query in enumerate(r.queries):
            for metric in r.metrics:
                value = r.per_query[metric][i]
                rows.append({
                    "datetime": when.isoformat(),
                    "search_config": r.system,
                    "query_set_id": query_set,
                    "query": query,
                    "metric": metric,
                    "value": value,
                    "application": None if app == NO_APPLICATION else app,
                    "evaluation_id": evaluation,
                })
    return rows


def render_dashboard(report: Report, *, index: str = DEFAULT_INDEX) -> bytes:
    """The rows as an OpenSearch ``_bulk`` body (NDJSON, action line before each row)."""
    out = bytearray()
    for row in dashboard_rows(report):
        key = "\x1f".join(str(row[k]) for k in ("evaluation_id", "query_set_id", "query", "metric"))
        out += orjson.dumps({"index": {"_index": index, "_id": str(uuid.uuid5(_NAMESPACE, key))}}) + b"\n"
        out += orjson.dumps(row) + b"\n"
    return bytes(out)
