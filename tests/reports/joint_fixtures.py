"""A small hand-checkable world for the joint-report tests: one shop, two rankers, human and implicit labels.

Every number the tests expect is worked out by hand from the records below (see each test's comments).

Searches (T = 2025-01-01T10:00:00Z; times in seconds after T):

ranker a (``shop/ranker=a``)
  a1  t=0    "red shoes"    hits d1 d2 d4   session S1   click d1 (ordinal 0) at t=5
  a2  t=300  "Red  Shoes"   hits d1 d2 d4   session S2   (an impression-free search, no click; a search event
                                                          gives it its session)
  a3  t=600  "red shoes"    hits d2 d1 d4   session S3   click d4 (ordinal 2) at t=610, click d2 (ordinal 0) at t=620
  a4  t=630  "blue hat"     hits h2 h1      session S3   click h1 (ordinal 1) at t=632
  a5  t=3600 "green bag"    hits b1 b2      session S4   impression of b1 only (ordinal 0)
ranker b (``shop/ranker=b``)
  b1  t=0    "red shoes"    hits d4 d1 d2   session S5   click d1 (ordinal 1) at t=4
  b2  t=30   "blue hat"     hits h1 h2      session S5   click h1 (ordinal 0) at t=32
  b3  t=120  "green bag"    hits b2         client c6, no event
  b4  t=150  "purple socks" hits (empty)    client c6, no event: a zero-result search

Human judgments (JSONL): red shoes {d1: 3, d2: 1, d3: 0}, blue hat {h1: 2, h2: 0}, green bag {b1: 0}
(a labelled negative). Implicit ``implicit:ctr`` rows: red shoes d1 -> 3, d2 -> 2, d4 -> 1; blue hat
h1 -> 1 (calibration split "fit"), h2 -> 0 (split "holdout"); green bag b2 -> no grade (too little support).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pytest

from tests.conftest import SAMPLE_LOG, shared_path
from ubi_pipeline.collector.ingest import ingest, parse_items, validate_items
from ubi_pipeline.store.client import open_reader
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import JUDGMENT_SCHEMA

T0 = datetime(2025, 1, 1, 10, 0, 0, tzinfo=UTC)
_ids = itertools.count()


def ts(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def query(qid: str, text: str, hits: list[str] | None, at: float, *, ranker: str | None = "a",
          client: str = "c1", application: str = "shop", **extra: Any) -> dict[str, Any]:
    q: dict[str, Any] = {"query_id": qid, "user_query": text, "timestamp": ts(at), "client_id": client,
                         "application": application, **extra}
    if ranker is not None:
        q["query_attributes"] = {"ranker": ranker}
    if hits is not None:
        q["query_response_hit_ids"] = hits
    return q


def event(action: str, qid: str, doc: str | None, ordinal: int | None, at: float, session: str | None,
          *, client: str = "c1") -> dict[str, Any]:
    e: dict[str, Any] = {"action_name": action, "query_id": qid, "timestamp": ts(at), "client_id": client,
                         "application": "shop", "event_id": f"e{next(_ids)}"}
    if session is not None:
        e["session_id"] = session
    attrs: dict[str, Any] = {}
    if doc is not None:
        attrs["object"] = {"object_id": doc}
    if ordinal is not None:
        attrs["position"] = {"ordinal": ordinal}
    if attrs:
        e["event_attributes"] = attrs
    return e


QUERIES = [
    query("a1", "red shoes", ["d1", "d2", "d4"], 0, client="c1"),
    query("a2", "Red  Shoes", ["d1", "d2", "d4"], 300, client="c2"),
    query("a3", "red shoes", ["d2", "d1", "d4"], 600, client="c3"),
    query("a4", "blue hat", ["h2", "h1"], 630, client="c3"),
    query("a5", "green bag", ["b1", "b2"], 3600, client="c4"),
    query("b1", "red shoes", ["d4", "d1", "d2"], 0, ranker="b", client="c5"),
    query("b2", "blue hat", ["h1", "h2"], 30, ranker="b", client="c5"),
    query("b3", "green bag", ["b2"], 120, ranker="b", client="c6"),
    query("b4", "purple socks", [], 150, ranker="b", client="c6"),
]

EVENTS = [
    event("click", "a1", "d1", 0, 5, "S1"),
    event("search", "a2", None, None, 300, "S2", client="c2"),
    event("click", "a3", "d4", 2, 610, "S3", client="c3"),
    event("click", "a3", "d2", 0, 620, "S3", client="c3"),
    event("click", "a4", "h1", 1, 632, "S3", client="c3"),
    event("impression", "a5", "b1", 0, 3601, "S4", client="c4"),
    event("click", "b1", "d1", 1, 4, "S5", client="c5"),
    event("click", "b2", "h1", 0, 32, "S5", client="c5"),
]

HUMAN_JSONL = (
    '{"query_id": "q1", "query": "red shoes", "relevant": {"d1": 3, "d2": 1, "d3": 0}, "assessor": "ann"}\n'
    '{"query_id": "q2", "query": "blue hat", "relevant": {"h1": 2, "h2": 0}}\n'
    '{"query_id": "q3", "query": "green bag", "relevant": {"b1": 0}}\n'
)


def _judgment(query: str, doc: str, grade: int | None, split: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"model": {"name": "ctr"}, "grade_mapping": {"calibrated": True}}
    if split is not None:
        params["calibration_split"] = split
    return {
        "query": query, "doc_id": doc, "source": "implicit:ctr", "model_version": "1", "parameters": orjson.dumps(params).decode(),
        "score": 0.5, "ci_low": 0.1, "ci_high": 0.9, "impressions": 20, "clicks": 10, "sessions": 20,
        "grade": grade, "created_at": datetime(2025, 1, 2),
    }


JUDGMENTS = [
    _judgment("red shoes", "d1", 3),
    _judgment("red shoes", "d2", 2),
    _judgment("red shoes", "d4", 1),
    _judgment("blue hat", "h1", 1, "fit"),
    _judgment("blue hat", "h2", 0, "holdout"),
    _judgment("green bag", "b2", None),
]



def ndjson(records: list[dict[str, Any]]) -> bytes:
    return b"\n".join(orjson.dumps(r) for r in records) + b"\n"


def build_store(path: Path, queries: list[dict[str, Any]] | None = None, events: list[dict[str, Any]] | None = None,
                judgments: list[dict[str, Any]] | None = None) -> Path:
    """A DuckDB store with these records, written through the real ingest stage (nothing may be rejected)."""
    with Store(path) as store:
        for kind, records in (("query", QUERIES if queries is None else queries),
                              ("event", EVENTS if events is None else events)):
            if not records:
                continue
            result = ingest(store, validate_items(parse_items(ndjson(records), kind, ndjson=True)), source="test")
            if result.rejected:
                raise AssertionError(f"fixture records rejected: {result.public()}")
        rows = JUDGMENTS if judgments is None else judgments
        if rows:
            store.load_table("judgments", pa.Table.from_pylist(rows, schema=JUDGMENT_SCHEMA))
    return path


def write_human(path: Path) -> Path:
    path.write_text(HUMAN_JSONL, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ the ESCI sample


def ingest_sample(path: Path) -> Path:
    """The real ESCI sample (`_bulk` export) ingested through the collector's own stage; skips when absent."""
    from ubi_pipeline.collector.ingest import parse_bulk

    with Store(path) as store:
        result = ingest(store, validate_items(parse_bulk(shared_path(SAMPLE_LOG).read_bytes())), source="sample")
    if result.rejected or result.queries != 473 or result.events != 3448:
        raise AssertionError(f"sample ingest: {result.public(5)}, {result.queries} queries, {result.events} events")
    return path


@pytest.fixture(scope="module")
def esci_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingest_sample(tmp_path_factory.mktemp("esci") / "esci.duckdb")


@pytest.fixture()
def esci_con(esci_db: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    con = open_reader(esci_db)
    yield con
    con.close()


def ubi(argv: list[str]) -> int:
    """Run ``ubi report`` / ``ubi queryset`` as ``ubi_pipeline.cli.main`` does (typed errors -> message, exit 2).

    Only this stage's commands are registered, so these tests do not depend on other stages importing cleanly.
    """
    import argparse
    import sys

    from ubi_pipeline.commands.report import register
    from ubi_pipeline.schemas.errors import UbiError

    parser = argparse.ArgumentParser(prog="ubi")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UbiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def hand_world_report(tmp: Path, config: Any, **build: Any) -> Any:
    """The report of the hand-checkable world (:func:`build_store` and :func:`write_human` under ``tmp``):
    its stored implicit labels and the human ones, built with ``config`` (a ``ReportConfig``) and ``build``
    (``build_report``'s other keywords)."""
    from ubi_pipeline.formats.qrels import load_qrels
    from ubi_pipeline.processors.labels.merge import LabelSet, labels_from_human, labels_from_store
    from ubi_pipeline.reports.joint import build_report

    con = open_reader(build_store(tmp / "ubi.duckdb"))
    try:
        labels = LabelSet().add(labels_from_store(con))
        labels.add(labels_from_human(load_qrels(write_human(tmp / "h.jsonl")).human_judgments()))
        return build_report(con, labels, config, inputs={"db": str(tmp / "ubi.duckdb")}, **build)
    finally:
        con.close()
