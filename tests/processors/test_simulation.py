"""The traffic simulator: determinism, UBI records as OpenSearch tooling writes them, truth file, round trips."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from ubi_pipeline.cli import main
from ubi_pipeline.collector.ingest import ingest, parse_bulk, validate_items
from ubi_pipeline.processors.clicks.sessions import read_sessions
from ubi_pipeline.processors.clicks.stats import cells_from_sessions
from ubi_pipeline.processors.simulation import (
    SimConfig,
    SimulationError,
    build_catalog,
    simulate,
    simulate_patterns,
)
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.ubi import UbiEvent, UbiQuery
from ubi_pipeline.store.duckdb_store import Store

N = 300  # sessions in the small logs below
K = 10


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def small() -> object:
    return simulate(SimConfig(sessions=N, seed=5, randomize=0.5))


# ---------------------------------------------------------------- determinism


def test_same_seed_same_bytes_and_different_seed_differs(tmp_path: Path) -> None:
    paths = {}
    for name, seed in (("a", 11), ("b", 11), ("c", 12)):
        t = simulate(sessions=500, seed=seed, randomize=0.2)
        t.write_bulk(tmp_path / f"{name}.ndjson")
        t.write_truth(tmp_path / f"{name}.json")
        paths[name] = (tmp_path / f"{name}.ndjson", tmp_path / f"{name}.json")
    assert sha(paths["a"][0]) == sha(paths["b"][0])
    assert sha(paths["a"][1]) == sha(paths["b"][1])
    assert sha(paths["a"][0]) != sha(paths["c"][0])
    # a different seed also draws a different catalog (grades), so the truth differs too
    assert sha(paths["a"][1]) != sha(paths["c"][1])


def test_cli_same_seed_same_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("x", "y"):
        assert main(["simulate", "--sessions", "400", "--seed", "3", "--out", str(tmp_path / f"{name}.ndjson"),
                     "--truth", str(tmp_path / f"{name}.json"), "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
    assert summary["sessions"] == 400 and summary["written"]["format"] == "opensearch _bulk"
    assert sha(tmp_path / "x.ndjson") == sha(tmp_path / "y.ndjson")
    assert sha(tmp_path / "x.json") == sha(tmp_path / "y.json")


def test_summary_per_ranker_ctr_is_clicks_over_impressions(small: object) -> None:
    """CTR = clicks / impressions (10 per search); the share of searches with a click is reported apart."""
    rankers = small.summary()["rankers"]
    assert sum(r["searches"] for r in rankers) == N
    for i, r in enumerate(rankers):
        sel = small.ranker == i
        assert r["impressions"] == int(sel.sum()) * K
        assert r["clicks"] == int(small.clicks[sel].sum())
        assert r["ctr"] == pytest.approx(r["clicks"] / r["impressions"])
        assert r["searches_with_click"] == pytest.approx(float(small.clicks[sel].any(axis=1).mean()))
        assert r["ctr"] < r["searches_with_click"]  # ~1.8 clicks over 10 results, most searches have one


# ---------------------------------------------------------------- records


def test_records_validate_and_counts_are_exact(small: object) -> None:
    queries = list(small.queries)
    events = list(small.events)
    clicks = int(small.clicks.sum())
    assert len(queries) == len(small.queries) == N
    assert len(events) == len(small.events) == N * K + clicks
    for q in queries:
        UbiQuery.model_validate(q)
    for e in events:
        UbiEvent.model_validate(e)
    assert sum(e["action_name"] == "impression" for e in events) == N * K
    assert sum(e["action_name"] == "click" for e in events) == clicks
    assert len({q["query_id"] for q in queries}) == N
    assert len({e["event_id"] for e in events}) == len(events)


def test_first_and_last_search_exactly(small: object) -> None:
    queries = list(small.queries)
    first, last = queries[0], queries[-1]
    assert first["query_id"] == "sim5-000000"
    assert first["client_id"] == "client5-000000"
    assert first["timestamp"] == "2025-01-06T09:00:00.000Z"
    assert first["application"] == "ubi-sim" and first["object_id_field"] == "product_id"
    # search 299 is client 299 // 5 = 59's fifth search: 09:00 + 59 x 20 s + 4 x 30 s = 09:21:40
    assert last["query_id"] == "sim5-000299"
    assert last["client_id"] == "client5-000059"
    assert last["timestamp"] == "2025-01-06T09:21:40.000Z"
    assert len(last["query_response_hit_ids"]) == K
    assert last["query_attributes"]["ranker"] in ("ranker-a", "ranker-b", "ranker-c")


def test_ordinals_are_zero_based_and_match_hit_ids(small: object) -> None:
    for i, (query, events) in enumerate(small.iter_searches()):
        hits = query["query_response_hit_ids"]
        imps = [e for e in events if e["action_name"] == "impression"]
        assert [e["event_attributes"]["position"]["ordinal"] for e in imps] == list(range(K))
        for e in events:
            ordinal = e["event_attributes"]["position"]["ordinal"]
            assert hits[ordinal] == e["event_attributes"]["object"]["object_id"]
            assert e["query_id"] == query["query_id"] and e["user_query"] == query["user_query"]
        clicked = sorted(e["event_attributes"]["position"]["ordinal"] for e in events if e["action_name"] == "click")
        assert clicked == np.flatnonzero(small.clicks[i]).tolist()
        # docs of a search belong to its query
        assert all(h.startswith(query["user_query"].replace(" ", "-")) for h in hits)


def test_randomized_searches_are_marked_and_swapped(small: object) -> None:
    """A swap-k search shows the ranker's list with ranks 1 and k exchanged (epochs = 1: one list per ranker)."""
    plain: dict[tuple[str, str], list[str]] = {}
    swapped = []
    for query, _ in small.iter_searches():
        key = (query["user_query"], query["query_attributes"]["ranker"])
        mark = query["query_attributes"].get("randomized")
        if mark is None or mark["ranks"] == [1, 1]:
            plain[key] = query["query_response_hit_ids"]
        else:
            assert mark["method"] == "swap" and mark["ranks"][0] == 1 and 2 <= mark["ranks"][1] <= K
            swapped.append((key, mark["ranks"][1], query["query_response_hit_ids"]))
    n_marked = int((small.swap > 0).sum())
    assert 0.4 * N < n_marked < 0.6 * N  # randomize = 0.5
    checked = 0
    for key, k, hits in swapped:
        if key in plain:
            expect = list(plain[key])
            expect[0], expect[k - 1] = expect[k - 1], expect[0]
            assert hits == expect
            checked += 1
    assert checked > 50


def test_bulk_file_parses_with_the_collector(tmp_path: Path, small: object) -> None:
    path = tmp_path / "sim.ndjson"
    records = small.write_bulk(path)
    items = parse_bulk(path.read_bytes())
    validated = validate_items(items)
    assert records == len(items) == N * (K + 1) + int(small.clicks.sum())
    assert not validated.errors
    assert len(validated.queries) == N
    # the action line's _id is the event id, so replaying the file deduplicates
    assert all(bulk_id == e.event_id for _, e, bulk_id in validated.events)


def test_store_round_trip_gives_the_in_memory_cells(tmp_path: Path) -> None:
    """Records -> ingest -> ubi_pipeline.processors.clicks.sessions gives exactly the cells of the simulated arrays."""
    traffic = simulate(sessions=600, seed=9, randomize=0.3)
    db = tmp_path / "sim.duckdb"
    path = tmp_path / "sim.ndjson"
    traffic.write_bulk(path)
    with Store(db) as store:
        result = ingest(store, validate_items(parse_bulk(path.read_bytes())), source="test")
    assert result.rejected == 0 and result.accepted == 600 * (K + 1) + traffic.n_clicks
    data = read_sessions(db, Settings(db=db), max_rank=K)
    assert data.filters.bot_searches == 0 and data.filters.click_all_searches == 0
    assert data.filters.sessions == 600 and data.filters.clicks == traffic.n_clicks

    def keyed(cells: object) -> dict[tuple[str, str, int], tuple[int, int]]:
        p = cells.pairs
        return {(str(p.queries[a]), str(p.doc_ids[a]), int(r)): (int(i), int(c))
                for a, r, i, c in zip(cells.pair, cells.rank, cells.impressions, cells.clicks, strict=True)}

    assert keyed(data.cells) == keyed(cells_from_sessions(traffic.patterns()))


# ---------------------------------------------------------------- truth


def test_truth_file_contents(tmp_path: Path, small: object) -> None:
    small.write_truth(tmp_path / "truth.json")
    truth = orjson.loads((tmp_path / "truth.json").read_bytes())
    # θ_k = (1/k)^η with η = 1
    assert truth["theta"] == pytest.approx([1 / k for k in range(1, K + 1)])
    assert truth["theta_ratio"] == pytest.approx(truth["theta"])
    # ε⁻ + (ε⁺ − ε⁻)(2^g − 1)/7 with ε⁻ = 0.1, ε⁺ = 1: 0.1, 0.1 + 0.9/7, 0.1 + 2.7/7, 1.0
    assert truth["grade_click_prob"] == pytest.approx([0.1, 0.1 + 0.9 / 7, 0.1 + 2.7 / 7, 1.0])
    assert truth["max_grade"] == 3 and truth["model"] == "pbm"
    assert [r["name"] for r in truth["rankers"]] == ["ranker-a", "ranker-b", "ranker-c"]
    assert [r["noise"] for r in truth["rankers"]] == pytest.approx([0.5, 1.0, 2.0])
    assert len(truth["queries"]) == 40 and len(truth["qrels"]) == 40
    probs = truth["grade_click_prob"]
    for q, qrel in zip(truth["queries"], truth["qrels"], strict=True):
        assert len(q["docs"]) == 20
        assert q["query_id"] == qrel["query_id"] and q["query"] == qrel["query"]
        assert qrel["relevant"] == {d["doc_id"]: d["grade"] for d in q["docs"]}
        grades = [d["grade"] for d in q["docs"]]
        assert max(grades) == 3 and min(grades) == 0
        for d in q["docs"]:
            assert d["attractiveness"] == pytest.approx(probs[d["grade"]])
    assert truth["queries"][0]["query"] == "red running shoes"


def test_qrels_jsonl(tmp_path: Path, small: object) -> None:
    assert small.write_qrels(tmp_path / "q.jsonl") == 40
    rows = [json.loads(line) for line in (tmp_path / "q.jsonl").read_text().splitlines()]
    assert rows[0]["query_id"] == "q01" and rows[0]["query"] == "red running shoes"
    assert all(set(r) == {"query_id", "query", "relevant"} for r in rows)


def test_truth_aligns_with_pattern_pairs() -> None:
    patterns, truth = simulate_patterns(sessions=2000, seed=4)
    grades, attract = truth.pair_lookup(patterns.pairs)
    assert (grades >= 0).all() and np.isfinite(attract).all()
    assert attract == pytest.approx(truth.grade_click_prob[grades])


# ---------------------------------------------------------------- models and patterns


def test_patterns_carry_every_session_and_click(small: object) -> None:
    p = small.patterns()
    assert p.n_sessions == N
    assert int((p.clicks * p.weight[:, None]).sum()) == int(small.clicks.sum())
    assert len(p.pairs) == len(np.unique(small.query[:, None] * 20 + small.slots))


def test_cascade_clicks_at_most_once_and_dbn_and_trust_run() -> None:
    cascade = simulate(sessions=3000, seed=1, model="cascade")
    assert cascade.clicks.sum(axis=1).max() == 1
    assert cascade.truth.theta is None and cascade.truth.to_json()["theta"] is None
    dbn = simulate(sessions=3000, seed=1, model="dbn")
    assert dbn.truth.satisfaction is not None and dbn.clicks.sum() > 0
    trust = simulate(sessions=3000, seed=1, model="trust")
    t = trust.truth.to_json()
    # ε⁺_k = 1 − (k+1)/100, ε⁻_k = 0.65/k (Agarwal et al. 2019 protocol)
    assert t["eps_pos"][:2] == pytest.approx([0.98, 0.97]) and t["eps_neg"][:2] == pytest.approx([0.65, 0.325])


def test_rankers_differ_in_quality() -> None:
    """ranker-a (σ = 0.5) puts better grades on top than ranker-c (σ = 2.0): mean grade at rank 1."""
    t = simulate(sessions=6000, seed=2)
    top_grade = t.truth.catalog.grades[t.query, t.slots[:, 0]]
    means = [top_grade[t.ranker == r].mean() for r in range(3)]
    assert means[0] > means[1] > means[2]


def test_catalog_is_deterministic_and_large_catalogs_name_queries() -> None:
    a, b = build_catalog(60, seed=1), build_catalog(60, seed=1)
    assert (a.grades == b.grades).all() and a.query_texts == b.query_texts
    assert a.query_texts[50] == "red running shoes for kids"
    assert len(set(build_catalog(700).query_texts)) == 700


@pytest.mark.parametrize("bad", [{"sessions": 0}, {"model": "nope"}, {"randomize": 1.5}, {"max_rank": 21},
                                 {"rankers": 2, "ranker_noise": (1.0,)}, {"eps_minus": 0.9, "eps_plus": 0.5}])
def test_bad_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(SimulationError):
        simulate(SimConfig(**bad))


# ---------------------------------------------------------------- posting to a running collector


@pytest.fixture
def collector(tmp_path: Path) -> object:
    import uvicorn

    from ubi_pipeline.collector.app import create_app

    db = tmp_path / "live.duckdb"
    # port 0: uvicorn binds a free port itself (one picked in advance may be taken by another program meanwhile)
    server = uvicorn.Server(uvicorn.Config(create_app(Settings(db=db)), host="127.0.0.1", port=0,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("collector did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", db
    server.should_exit = True
    thread.join(timeout=20)


def test_post_to_a_running_collector(collector: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    url, db = collector
    traffic = simulate(sessions=120, seed=8)
    result = traffic.post(url, batch_searches=50)
    total = 120 * (K + 1) + traffic.n_clicks
    assert result.queries_sent == 120 and result.events_sent == 120 * K + traffic.n_clicks
    assert result.accepted == total and result.rejected == 0 and result.duplicates == 0
    assert result.requests == 6  # 3 batches of searches x (queries, events)
    # the CLI posts the same log again: everything is a duplicate (event ids and query ids are stable)
    assert main(["simulate", "--sessions", "120", "--seed", "8", "--post", url, "--json"]) == 0
    posted = json.loads(capsys.readouterr().out)["posted"]
    assert posted["accepted"] == 0 and posted["duplicates"] == total


# ---------------------------------------------------------------- the hard scenario


def test_hard_scenario_preset_and_overrides() -> None:
    from ubi_pipeline.processors.simulation import SCENARIOS, scenario

    c = scenario("hard", sessions=100, model="dbn")
    assert (c.queries, c.query_skew, c.rankers, c.ranker_noise, c.crawler_share) == (1000, 1.0, 4, (0.3, 0.8, 1.5, 3.0), 0.05)
    assert c.model == "dbn" and c.sessions == 100
    assert scenario("demo") == SimConfig() and set(SCENARIOS) == {"demo", "hard"}
    with pytest.raises(SimulationError, match="unknown scenario"):
        scenario("easy")
    with pytest.raises(SimulationError, match="crawler share"):
        scenario("hard", crawler_share=1.0)


def test_hard_scenario_has_a_long_tail_of_rare_queries() -> None:
    """Zipf (skew 1) over 1,000 queries: at 20,000 searches the most popular query expects 20,000 / H_1000 = 2,670
    searches (H_1000 = 7.485) and the rarest 2.7; most queries get fewer than 10."""
    from ubi_pipeline.processors.simulation import scenario

    t = simulate(scenario("hard", sessions=20_000, seed=2, crawler_share=0.0))
    per_query = np.bincount(t.query, minlength=1000)
    assert 2_300 < per_query.max() < 3_100
    assert (per_query < 10).mean() > 0.5 and (per_query == 0).sum() < 150


def test_crawlers_are_exactly_what_the_session_filter_drops(tmp_path: Path) -> None:
    from ubi_pipeline.processors.simulation import scenario

    t = simulate(scenario("hard", sessions=3000, seed=8))
    n_crawl = t.n_crawler_searches
    assert 100 < n_crawl < 200  # 5% of 3,000 is 150
    # crawler clicks ignore relevance: their CTR is the crawler click probability at every rank
    assert abs(t.clicks[t.crawler].mean() - 0.3) < 0.03
    path, db = tmp_path / "hard.ndjson", tmp_path / "hard.duckdb"
    t.write_bulk(path)
    with Store(db) as store:
        result = ingest(store, validate_items(parse_bulk(path.read_bytes())), source="test")
    assert result.rejected == 0
    data = read_sessions(db, Settings(db=db), max_rank=K)
    # 150-odd crawler searches go to one crawler client (at least 100 each, up to the scenario's 3)
    assert t.n_crawler_clients == 1
    assert data.filters.bot_clients == 1 and data.filters.bot_searches == n_crawl
    assert data.filters.sessions == 3000 - n_crawl
    # and what is left is the in-memory log without the crawlers, cell for cell
    keep = t.patterns()
    assert keep.n_sessions == 3000 - n_crawl and t.patterns(crawlers=True).n_sessions == 3000
    got = {(str(data.pairs.queries[a]), str(data.pairs.doc_ids[a]), int(r)): (int(i), int(c)) for a, r, i, c in
           zip(data.cells.pair, data.cells.rank, data.cells.impressions, data.cells.clicks, strict=True)}
    cells = cells_from_sessions(keep)
    want = {(str(cells.pairs.queries[a]), str(cells.pairs.doc_ids[a]), int(r)): (int(i), int(c)) for a, r, i, c in
            zip(cells.pair, cells.rank, cells.impressions, cells.clicks, strict=True) if i > 0}
    assert got == want


def test_crawlers_do_not_change_the_rest_of_a_log() -> None:
    """The crawler stream is a fourth random stream: a log without crawlers is byte-for-byte what it was."""
    plain = simulate(SimConfig(sessions=500, seed=3))
    again = simulate(SimConfig(sessions=500, seed=3, crawler_share=0.0))
    assert plain.crawler is None and (plain.clicks == again.clicks).all()
    with_crawlers = simulate(SimConfig(sessions=500, seed=3, crawler_share=0.2))
    human = ~with_crawlers.crawler
    assert (with_crawlers.clicks[human] == plain.clicks[human]).all()


def test_cli_scenario_hard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "h.ndjson"
    assert main(["simulate", "--scenario", "hard", "--sessions", "400", "--seed", "1", "--out", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["queries"] == 1000 and len(s["rankers"]) == 4 and s["crawler_searches"] > 0
    assert main(["simulate", "--scenario", "hard", "--sessions", "400", "--rankers", "2", "--crawlers", "0",
                 "--out", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert len(s["rankers"]) == 2 and s["crawler_searches"] == 0


def test_store_written_in_pieces_holds_exactly_the_rows_of_one_piece(tmp_path: Path) -> None:
    """write_store inserts ``chunk`` searches at a time (bounded memory at 50M events): same rows as one piece."""
    import duckdb

    from ubi_pipeline.processors.simulation.bulk_log import write_store

    whole, parts = tmp_path / "whole.duckdb", tmp_path / "parts.duckdb"
    counts = write_store(whole, 24_000, seed=5, chunk=10_000_000)
    assert write_store(parts, 24_000, seed=5, chunk=333) == counts  # 2,000 searches in 7 pieces (6 of 333, 1 of 2)
    assert counts[0] == 2_000  # 24,000 / 12 searches, one query record each
    digest = ("SELECT count(*), sum(hash(COLUMNS(*))) FROM {}")
    with duckdb.connect(str(whole), read_only=True) as a, duckdb.connect(str(parts), read_only=True) as b:
        for table in ("ubi_queries", "ubi_events"):
            assert a.sql(digest.format(table)).fetchall() == b.sql(digest.format(table)).fetchall()


def test_written_store_has_a_key_row_for_every_stored_row(tmp_path: Path) -> None:
    """write_store leaves the store as an import does: each ``ubi_queries`` / ``ubi_events`` row has its key row
    (the 64-bit hash of its key and its rowid), so the first writer to open it has nothing to fill."""
    import duckdb

    from ubi_pipeline.processors.simulation.bulk_log import write_store

    db = tmp_path / "s.duckdb"
    nq, ne = write_store(db, 12_000, seed=4)
    with duckdb.connect(str(db), read_only=True) as con:
        for table, keys, key, n in (("ubi_queries", "ubi_query_keys", "query_key", nq),
                                    ("ubi_events", "ubi_event_keys", "event_key", ne)):
            ((stored, matching),) = con.sql(f"""
                SELECT (SELECT count(*) FROM {keys}),
                       (SELECT count(*) FROM {keys} k JOIN {table} t
                        ON t.rowid = k.row_id AND md5_number_lower(t.{key}) = k.key_hash)""").fetchall()
            assert stored == matching == n > 0
