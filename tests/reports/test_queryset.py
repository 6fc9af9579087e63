"""Query sets: top, uniform random and probability-proportional-to-size samples, exactly N, both formats."""

from __future__ import annotations

import json
from collections import Counter

import joint_fixtures
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from joint_fixtures import build_store, query, ubi

from tests.conftest import shared_path
from ubi_pipeline.formats.qrels import load_queryset
from ubi_pipeline.processors.labels.queryset import QuerySetError, SampledQuery, query_frequencies, sample
from ubi_pipeline.store.client import open_reader

esci_db = joint_fixtures.esci_db


def test_frequencies_count_search_instances(tmp_path):
    queries = [
        query("q1", "Red Shoes", ["a"], 0), query("q2", "red  shoes", ["a"], 1), query("q3", "hat", ["b"], 2),
        {**query("q4", "hat", [], 3), "query_response_id": "r1"},  # one search, two sub-search responses
        {**query("q4", "hat", ["b"], 3), "query_response_id": "r2"},
        query("q5", "   ", None, 4),  # empty after normalisation: not a query to review
        query("q6", "cap", ["c"], 5, application="other"),
    ]
    con = open_reader(build_store(tmp_path / "q.duckdb", queries, [], []))
    try:
        freq = query_frequencies(con)
        shop = query_frequencies(con, application="shop")
    finally:
        con.close()
    assert freq == [SampledQuery("hat", 2), SampledQuery("red shoes", 2), SampledQuery("cap", 1)]
    assert [q.query for q in shop] == ["hat", "red shoes"]


POP = [SampledQuery(f"q{i:02d}", f) for i, f in enumerate([50, 20, 10, 5, 5, 3, 2, 1, 1, 1])]


def test_top_random_pptss_exactly_n():
    assert [q.query for q in sample(POP, "top", 3)] == ["q00", "q01", "q02"]
    for strategy in ("random", "pptss"):
        got = sample(POP, strategy, 6, seed=3)
        assert len(got) == 6 and len({q.query for q in got}) == 6
        assert sample(POP, strategy, 6, seed=3) == got  # seeded
    assert len(sample(POP, "pptss", 50)) == len(POP)  # fewer distinct queries than asked: all of them
    with pytest.raises(QuerySetError):
        sample(POP, "best", 3)  # type: ignore[arg-type]
    with pytest.raises(QuerySetError):
        sample(POP, "top", 0)
    with pytest.raises(QuerySetError):
        sample([], "top", 1)


def test_pptss_inclusion_follows_frequency():
    # Efraimidis-Spirakis with n = 1 picks item i with probability w_i / sum(w): q00 50/98 = 0.510
    picks = Counter(sample(POP, "pptss", 1, seed=s)[0].query for s in range(3000))
    assert picks["q00"] / 3000 == pytest.approx(50 / 98, abs=0.03)
    assert picks["q01"] / 3000 == pytest.approx(20 / 98, abs=0.025)
    # uniform random: each of 10 about 1/10
    uni = Counter(sample(POP, "random", 1, seed=s)[0].query for s in range(3000))
    assert uni["q00"] / 3000 == pytest.approx(0.1, abs=0.025)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=40), st.integers(1, 50), st.integers(0, 2**16),
       st.sampled_from(["top", "random", "pptss"]))
def test_always_exactly_n_distinct(freqs, n, seed, strategy):
    pop = [SampledQuery(f"q{i}", f) for i, f in enumerate(freqs)]
    got = sample(pop, strategy, n, seed=seed)
    assert len(got) == min(n, len(pop)) == len({q.query for q in got})
    assert {q.query for q in got} <= {q.query for q in pop}


def test_cli_writes_both_formats_that_load_back(esci_db, tmp_path):
    wb, jl = tmp_path / "qs.json", tmp_path / "qs.jsonl"
    assert ubi(["queryset", "--db", str(esci_db), "--strategy", "pptss", "--size", "25", "--seed", "7",
                "--format", "workbench", "--out", str(wb)]) == 0
    assert ubi(["queryset", "--db", str(esci_db), "--strategy", "top", "--size", "5", "--out", str(jl)]) == 0
    doc = json.loads(wb.read_text())
    shape = json.loads((shared_path("ubi-samples/esci_us_queryset.json")).read_text())
    assert set(doc) == set(shape) and len(doc["querySetQueries"]) == 25
    assert len(load_queryset(wb)) == 25  # the offline-metrics loader accepts it
    top = load_queryset(jl)
    # most frequent in the sample: "gold" and "wireless earbuds", 14 searches each (Chorus); ties by text
    assert [q.query for q in top][:2] == ["gold", "wireless earbuds"]
    assert [q.frequency for q in top][:2] == [14, 14]
    assert np.all(np.diff([q.frequency for q in top]) <= 0)
