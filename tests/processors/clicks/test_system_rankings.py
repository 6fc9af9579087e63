"""Which system showed which ranking, from the session build's own search table (load_sessions(systems=True)),
is what ubi_pipeline.processors.clicks.system_rankings.load_system_rankings reads from ubi_queries a second time."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import orjson
import pytest

from ubi_pipeline.collector.ingest import ingest, parse_bulk, validate_items
from ubi_pipeline.processors.click_models.priors import MAX_SYSTEMS
from ubi_pipeline.processors.clicks import system_rankings
from ubi_pipeline.processors.clicks.sessions import read_sessions
from ubi_pipeline.processors.clicks.stats import PairIndex, SystemRankings
from ubi_pipeline.processors.labels import implicit as judgments
from ubi_pipeline.processors.simulation import scenario, simulate
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.systems import system_name
from ubi_pipeline.schemas.text import normalize_query
from ubi_pipeline.store.client import reading
from ubi_pipeline.store.duckdb_store import Store


def _bulk(records: list[dict]) -> bytes:
    lines = []
    for i, rec in enumerate(records):
        lines += [orjson.dumps({"index": {"_index": "ubi_queries", "_id": f"edge-record-{i}"}}), orjson.dumps(rec)]
    return b"\n".join(lines) + b"\n"


def _record(query_id: str, text: str, ts: str, hits: list[str], ranker: str = "ranker-d") -> dict:
    # a query_response_id of its own: two records of one query_id are two responses, not a conflict
    return {"application": "ubi-sim", "query_id": query_id, "query_response_id": f"{query_id}@{ts}",
            "client_id": "client-x", "user_query": text,
            "timestamp": ts, "query_attributes": {"ranker": ranker}, "object_id_field": "product_id",
            "query_response_hit_ids": hits}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two applications of simulated traffic (4 rankers each) and query records on the earliest-record rule's edges."""
    tmp = tmp_path_factory.mktemp("sr")
    db = tmp / "sim.duckdb"
    first = simulate(scenario("hard", sessions=600, seed=5, model="pbm", crawler_share=0.0))
    second = simulate(dataclasses.replace(scenario("hard", sessions=400, seed=6, model="pbm", crawler_share=0.0),
                                          application="other-shop"))
    with Store(db) as st:
        for i, traffic in enumerate((first, second)):
            traffic.write_bulk(tmp / f"t{i}.ndjson")
            ingest(st, validate_items(parse_bulk((tmp / f"t{i}.ndjson").read_bytes())), source="test")
        qid, text, hits = st.con.execute("SELECT query_id, user_query, query_response_hit_ids FROM ubi_queries "
                                         "ORDER BY query_id LIMIT 1").fetchall()[0]
        extra = [
            # a later record of a logged search with another list: the earliest one stays its ranking
            _record(qid, text, "2030-01-01T00:00:00.000Z", list(reversed(hits))),
            # a search whose earliest record has no list: its later record with one is its ranking
            _record("edge-1", text, "2025-01-01T00:00:00.000Z", []),
            _record("edge-1", text, "2025-01-01T00:00:01.000Z", [hits[1], hits[0], *hits[2:]], "ranker-z"),
            # the same query spelt otherwise (the same after normalising): a ranking of its own raw text
            _record("edge-2", "  " + text.upper() + " ", "2025-01-02T00:00:00.000Z", hits[:3], "ranker-y"),
        ]
        ingest(st, validate_items(parse_bulk(_bulk(extra))), source="test")
        assert st.con.execute("SELECT count(*) FROM ubi_queries WHERE query_id IN (?, 'edge-1', 'edge-2')",
                              [qid]).fetchall()[0][0] == 5  # every edge record stored, none a conflict
    return db


def rows(sr: SystemRankings, pairs: PairIndex) -> Counter:
    """Each ranking as (query text, system name, docs), counted: the content, whatever the rows' order."""
    text = {int(qi): str(q) for qi, q in zip(pairs.query_index, pairs.queries, strict=True)}
    return Counter((text[int(q)], sr.names[int(s)], tuple(str(pairs.doc_ids[d]) if d >= 0 else None for d in row))
                   for q, s, row in zip(sr.query, sr.system, sr.docs, strict=True))


def test_the_session_build_gives_the_same_rankings_as_a_second_read(store: Path) -> None:
    data = read_sessions(store, Settings(db=store), max_rank=10, systems=True)
    assert data.systems is not None and data.train_systems is None  # no held-out split asked for
    with reading(store) as con:
        again = system_rankings.load_system_rankings(con, data.pairs, 10)
    assert data.systems.names == again.names
    assert len(data.systems.names) == 8 + 2  # 4 rankers in each application, and the edge records' two
    assert rows(data.systems, data.pairs) == rows(again, data.pairs)
    assert max(rows(data.systems, data.pairs).values()) >= 1
    # the ranking ids are numbered in (text, system, list) order: the same arrays on every read
    twice = read_sessions(store, Settings(db=store), max_rank=10, systems=True).systems
    for field in ("query", "system", "docs"):
        assert (getattr(twice, field) == getattr(data.systems, field)).all()


def test_the_rankings_are_those_of_each_searchs_earliest_record_with_a_list(store: Path) -> None:
    """The rule of the module docstring applied in Python to every stored query record: the reference."""
    data = read_sessions(store, Settings(db=store), max_rank=10, systems=True)
    with reading(store) as con:
        records = con.execute("SELECT query_id, user_query, application, query_attributes, timestamp, query_key, "
                              "query_response_hit_ids FROM ubi_queries").fetchall()
    best: dict[str, tuple] = {}
    for qid, text, app, attrs, ts, key, hits in records:
        order = (not hits, ts, key)  # a record with a list first, then the earliest, then the record key
        if qid not in best or order < best[qid][0]:
            best[qid] = (order, text, system_name(app, orjson.loads(attrs) if attrs else None), hits)
    assert len(best) == 1000 + 2  # 600 + 400 simulated searches and the two edge searches
    shown = {(text, system, tuple(hits[:10])) for _, text, system, hits in best.values() if hits}
    pair_of = {(str(q), str(d)) for q, d in zip(data.pairs.queries, data.pairs.doc_ids, strict=True)}
    expected: Counter = Counter()
    for text, system, hits in shown:
        q = normalize_query(text)
        docs = tuple(d if (q, d) in pair_of else None for d in hits) + (None,) * (10 - len(hits))
        if any(d is not None for d in docs):
            expected[(q, system, docs)] += 1
    got = rows(data.systems, data.pairs)
    assert got == expected
    # the edge records: ranker-z's list is edge-1's later record; the other spelling of the query is a ranking
    # of its own (counted once per raw text, as load_system_rankings counts it); the reversed list is nobody's
    names = {name for _, name, _ in got}
    assert {"ubi-sim/ranker=ranker-z", "ubi-sim/ranker=ranker-y"} <= names


@pytest.mark.parametrize("application", ["ubi-sim", "other-shop"])
def test_one_application_and_its_training_fold(store: Path, application: str) -> None:
    data = read_sessions(store, Settings(db=store), max_rank=10, systems=True, holdout=0.25, application=application)
    with reading(store) as con:
        every = system_rankings.load_system_rankings(con, data.pairs, 10, application=application)
        train = system_rankings.load_system_rankings(con, data.pairs, 10, application=application, holdout=0.25)
    assert rows(data.systems, data.pairs) == rows(every, data.pairs)
    assert rows(data.train_systems, data.pairs) == rows(train, data.pairs)
    assert 0 < sum(rows(train, data.pairs).values()) < sum(rows(every, data.pairs).values())
    assert {n.split("/")[0] for n in data.systems.names} == {application}


@pytest.mark.parametrize("model", ["pbm", "dbn", "coec"])
def test_process_takes_the_rankings_from_its_session_build(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                           model: str) -> None:
    """`ubi process --model pbm` no longer reads ubi_queries a second time: the second reader is never called.

    DBN and COEC take the systems too (their fit's ``systems``): before, `process` gave them only to PBM and UBM,
    so `--model dbn` fitted another prior than `--model auto` and `ubi select` did for the same model."""

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("ubi_queries read a second time")

    monkeypatch.setattr(system_rankings, "load_system_rankings", refuse)
    res = judgments.process(store, model, Settings(db=store), store=False)
    run = orjson.loads(res.run.runs.column("parameters")[0].as_py())
    # 10 systems showed rankings; the prior gives the MAX_SYSTEMS (8) that showed the most a vote (pbm.py's note)
    assert _find(run, "system_features") == f"{MAX_SYSTEMS} systems"


def _find(doc: object, key: str) -> object:
    """The first value of ``key`` anywhere in a JSON document (None if absent)."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        doc = list(doc.values())
    if isinstance(doc, list):
        for v in doc:
            found = _find(v, key)
            if found is not None:
                return found
    return None
