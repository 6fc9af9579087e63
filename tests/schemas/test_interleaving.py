"""Team-draft interleaving: the pure function's laws, the route, and clicks credited through the store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from ubi_pipeline.cli import main
from ubi_pipeline.collector.app import create_app
from ubi_pipeline.reports.interleaving import interleaving_results
from ubi_pipeline.schemas.interleaving import InterleavingError, team_draft
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.client import reading

docs = st.lists(st.sampled_from([f"d{i}" for i in range(30)]), min_size=0, max_size=15, unique=True)


def test_same_query_id_same_list_and_the_coin_varies_across_ids() -> None:
    rankings = {"baseline": ["a", "b", "c", "d"], "candidate": ["e", "f", "g", "h"]}
    first = team_draft("q-1", rankings)
    assert team_draft("q-1", rankings) == first  # a retry gets the same list
    assert len(first.hits) == 4 and set(first.teams.values()) == {"baseline", "candidate"}
    tops = {team_draft(f"q-{i}", rankings).hits[0] for i in range(40)}
    assert tops == {"a", "e"}  # either ranker can pick first


def test_identical_rankings_interleave_to_themselves() -> None:
    ranking = ["a", "b", "c", "d", "e"]
    out = team_draft("q", {"baseline": ranking, "candidate": ranking})
    assert out.hits == ranking


def test_a_hand_worked_draft() -> None:
    # A = (a, b, c), B = (b, d, e). Round 1 picks one from each (order by coin): {a, b}; round 2: A's best new
    # is c, B's best new is d; so the list is a permutation within rounds of (a, b | c, d) with a, c from A.
    out = team_draft("q", {"A": ["a", "b", "c"], "B": ["b", "d", "e"]}, size=4)
    assert set(out.hits[:2]) == {"a", "b"} and set(out.hits[2:]) == {"c", "d"}
    assert out.teams == {"a": "A", "b": "B", "c": "A", "d": "B"}


def test_one_ranker_exhausted_the_other_fills() -> None:
    out = team_draft("q", {"A": ["a"], "B": ["b", "c", "d"]}, size=10)
    assert sorted(out.hits) == ["a", "b", "c", "d"] and out.teams["d"] == "B"


@settings(max_examples=200, deadline=None)
@given(a=docs, b=docs, qid=st.text(min_size=1, max_size=8), size=st.integers(0, 20))
def test_team_draft_laws(a: list[str], b: list[str], qid: str, size: int) -> None:
    out = team_draft(qid, {"A": a, "B": b}, size=size)
    assert len(out.hits) == len(set(out.hits)) == min(size, len(set(a) | set(b)))
    assert set(out.teams) == set(out.hits)
    for name, ranking in (("A", a), ("B", b)):
        mine = [d for d in out.hits if out.teams[d] == name]
        assert all(d in ranking for d in mine)
        assert mine == sorted(mine, key=ranking.index)  # each ranker's order is kept
        # a ranker only skips a doc the list already holds: its picks are its best docs not yet shown
        for d in mine:
            before = ranking[: ranking.index(d)]
            assert all(x in out.hits[: out.hits.index(d)] for x in before)
    # while both rankers still had new docs, the teams stay within one pick of each other
    n_a = n_b = 0
    for d in out.hits:
        if out.teams[d] == "A":
            n_a += 1
        else:
            n_b += 1
        shown = set(out.hits[: n_a + n_b])
        if set(a) - shown and set(b) - shown:
            assert abs(n_a - n_b) <= 1


def test_each_ranker_gets_half_the_slots_in_expectation() -> None:
    # disjoint lists of 10, 10 slots: each team gets exactly 5 and each slot is baseline's half of the time
    at = np.zeros(10)
    n = 2000
    for i in range(n):
        out = team_draft(f"qid-{i}", {"baseline": [f"b{j}" for j in range(10)],
                                      "candidate": [f"c{j}" for j in range(10)]})
        assert list(out.teams.values()).count("baseline") == 5
        at += [out.teams[d] == "baseline" for d in out.hits]
    # binomial(2000, 0.5) sd is 22.4 searches: 4 sd is 0.045 of the share
    assert np.all(np.abs(at / n - 0.5) < 0.045), at / n


def test_errors_name_the_field() -> None:
    with pytest.raises(InterleavingError, match="field 'rankings'"):
        team_draft("q", {"A": ["a"]})
    with pytest.raises(InterleavingError, match="field 'rankings.B'"):
        team_draft("q", {"A": ["a"], "B": ["", "b"]})
    with pytest.raises(InterleavingError, match="field 'query_id'"):
        team_draft("", {"A": ["a"], "B": ["b"]})


def _serve_and_log(client: TestClient) -> None:
    """Interleave through the route and log four searches the way a backend would (one without a click)."""
    body = {"query_id": "iq-1", "rankings": {"baseline": ["a", "b", "c"], "candidate": ["c", "d", "a"]}}
    r = client.post("/v1/interleave", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert client.post("/v1/interleave", json=body).json() == answer  # seeded per query_id
    assert answer["method"] == "team_draft" and set(answer["teams"]) == set(answer["hits"])
    assert answer["query_attributes"]["interleaving"]["teams"] == answer["teams"]
    bad = client.post("/v1/interleave", json={"query_id": "x", "rankings": {"a": ["d"]}})
    assert bad.status_code == 400 and "exactly two rankings" in bad.text

    # three interleaved searches logged by the backend; the candidate's doc is clicked in two, the baseline's in one
    queries, events = [], []
    for i, winner in enumerate(["candidate", "candidate", "baseline", None]):
        qid = f"iq-{i + 10}"
        got = client.post("/v1/interleave", json={**body, "query_id": qid}).json()
        queries.append({"application": "shop", "query_id": qid, "client_id": "c1", "user_query": "red shoes",
                        "timestamp": f"2025-01-01T00:00:0{i}Z", "query_response_hit_ids": got["hits"],
                        "query_attributes": got["query_attributes"]})
        if winner is not None:
            doc = next(d for d in got["hits"] if got["teams"][d] == winner)
            events.append({"action_name": "click", "query_id": qid, "client_id": "c1", "application": "shop",
                           "timestamp": f"2025-01-01T00:00:0{i}.500Z", "user_query": "red shoes",
                           "event_attributes": {"object": {"object_id": doc, "object_id_field": "sku"}}})
    assert client.post("/v1/queries", json=queries).json()["accepted"] == 4
    assert client.post("/v1/events", json=events).json()["accepted"] == 3


def test_route_and_clicks_credited_through_the_store(tmp_path: Path) -> None:
    db = tmp_path / "ubi.duckdb"
    with TestClient(create_app(Settings(db=db), extensions=False)) as client:
        _serve_and_log(client)
    with reading(db) as con:
        results, notes = interleaving_results(con, ["click"], n_boot=200)
    assert notes == [] and len(results) == 1
    res = results[0]
    assert res.experiment == "candidate-vs-baseline"
    assert (res.searches, res.searches_without_clicks) == (4, 1)
    assert (res.by_search.wins, res.by_search.losses, res.by_search.ties) == (2, 1, 0)
    assert res.by_search.win_rate == pytest.approx(2 / 3)
    assert res.by_search.p_value == pytest.approx(1.0)  # binomial(3, 1/2): P(>= 2 of 3 either way) = 1
    assert (res.by_query.wins, res.queries) == (1, 1)  # one query, mean outcome (1 + 1 − 1)/3 > 0

    qrels = tmp_path / "q.jsonl"
    qrels.write_text(json.dumps({"query_id": "1", "query": "red shoes", "relevant": {"a": 1}}) + "\n")
    out = tmp_path / "r.json"
    code = main(["report", "--db", str(db), "--qrels", str(qrels), "--json", "--out", str(out),
                 "--min", "interleaving/candidate-vs-baseline/win_rate=0.5"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["interleaving"][0]["by_search"]["wins"] == 2
    assert doc["gates"]["passed"] and doc["gates"]["results"][0]["system"] == "shop"
    code = main(["report", "--db", str(db), "--qrels", str(qrels), "--out", str(tmp_path / "r.txt"),
                 "--min", "interleaving/candidate-vs-baseline/win_rate=0.7"])
    assert code == 1  # 2/3 < 0.7: the gate fails
    assert "Interleaving (team draft)" in (tmp_path / "r.txt").read_text()
