"""Online metrics on the hand-checkable world of joint_fixtures and on the ESCI sample."""

from __future__ import annotations

import joint_fixtures
import orjson
import pytest
from joint_fixtures import build_store, event, query

from tests.conftest import SAMPLE_LOG, shared_path
from ubi_pipeline.reports.online import OnlineError, online_metrics
from ubi_pipeline.reports.systems import load_searches
from ubi_pipeline.store.client import open_reader

esci_db, esci_con = joint_fixtures.esci_db, joint_fixtures.esci_con  # the sample store, as fixtures


@pytest.fixture()
def online(tmp_path):
    con = open_reader(build_store(tmp_path / "ubi.duckdb"))
    try:
        load_searches(con)
        yield online_metrics(con, k=1, max_rank=3, n_boot=500)
    finally:
        con.close()


def test_ranker_a_by_hand(online):
    a = online["shop/ranker=a"]
    m = a.metrics
    assert a.searches == 5 and a.searches_with_results == 5
    # displayed: a1 3, a2 3, a3 3, a4 2 (hit lists), a5 1 (its only impression, b1); clicked docs: a1 d1,
    # a3 d4 and d2, a4 h1 -> ctr = 4 / 12
    assert (m["ctr"].value, m["ctr"].n) == (pytest.approx(4 / 12), 12)
    # rank 1: a1 d1 (clicked), a2 d1, a3 d2 (clicked), a4 h2, a5 b1 -> ctr@1 = 2 / 5
    assert (m["ctr@1"].value, m["ctr@1"].n) == (pytest.approx(2 / 5), 5)
    # Wilson 95% for 2/5 (z = 1.959964): centre (0.4 + z²/10) / (1 + z²/5) = 0.443448,
    # half = z / (1 + z²/5) * sqrt(0.4*0.6/5 + z²/100) = 0.325827 -> [0.117621, 0.769275]
    assert m["ctr@1"].low == pytest.approx(0.117621, abs=1e-6)
    assert m["ctr@1"].high == pytest.approx(0.769275, abs=1e-6)
    # no click on a2 and a5 -> 2 / 5 abandoned
    assert m["abandonment"].value == pytest.approx(2 / 5)
    assert m["zero_result_rate"].value == 0.0 and m["zero_result_rate"].n == 5
    # first click in time: a1 rank 1 -> 1; a2 -> 0; a3 d4 at rank 3 (before d2 at rank 1) -> 1/3;
    # a4 h1 rank 2 -> 1/2; a5 -> 0; mean (1 + 0 + 1/3 + 1/2 + 0) / 5 = 0.366667
    assert m["rr_first_click"].value == pytest.approx((1 + 1 / 3 + 1 / 2) / 5)
    assert m["clicks_per_search"].value == pytest.approx(4 / 5)  # 1 + 0 + 2 + 1 + 0 click events
    # first clicks 5 s (a1), 10 s (a3), 2 s (a4) after their searches
    assert m["time_to_first_click"].value == pytest.approx(17 / 3) and m["time_to_first_click"].n == 3
    # session S3: a3 "red shoes" at 600 s, then a4 "blue hat" at 630 s -> a3 reformulated; 1 of 5
    assert m["reformulation_rate"].value == pytest.approx(1 / 5)
    # CTR by rank: rank 1 shown 5 clicked 2; rank 2 shown 4 (a1 d2, a2 d2, a3 d1, a4 h1) clicked 1 (h1);
    # rank 3 shown 3 (d4 three times) clicked 1 (a3)
    r = a.ctr_by_rank
    assert r is not None and (r.shown, r.clicked) == ([5, 4, 3], [2, 1, 1])


def test_ranker_b_by_hand(online):
    b = online["shop/ranker=b"]
    m = b.metrics
    # b4 returned nothing: 4 searches, 3 with results
    assert (b.searches, b.searches_with_results) == (4, 3)
    assert m["zero_result_rate"].value == pytest.approx(1 / 4)
    # displayed 3 + 2 + 1, clicked d1 (b1) and h1 (b2)
    assert m["ctr"].value == pytest.approx(2 / 6)
    assert m["abandonment"].value == pytest.approx(1 / 3)  # b3
    assert m["rr_first_click"].value == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert m["time_to_first_click"].value == pytest.approx((4 + 2) / 2)
    # S5: b1 -> b2 after 30 s; client c6 (no events): b3 -> b4 after 30 s; so 2 of 4 reformulated
    assert m["reformulation_rate"].value == pytest.approx(2 / 4)


def test_window_and_click_actions_are_settings(tmp_path):
    con = open_reader(build_store(tmp_path / "w.duckdb"))
    try:
        load_searches(con)
        narrow = online_metrics(con, reformulation_window_s=10, n_boot=100)
        # with a 10 s window neither a3 -> a4 (30 s) nor b1 -> b2 (30 s) counts
        assert narrow["shop/ranker=a"].metrics["reformulation_rate"].value == 0.0
        none = online_metrics(con, click_actions=("purchase",), n_boot=100)
        assert none["shop/ranker=a"].metrics["abandonment"].value == 1.0
        with pytest.raises(OnlineError):
            online_metrics(con, k=0)
    finally:
        con.close()


def test_position_base_places_clicks_outside_the_hit_list(tmp_path):
    # the clicked doc z is not in the hit list; its ordinal 3 is rank 4 with base 0, rank 3 with base 1
    queries = [query("p1", "x", ["a", "b", "c", "d"], 0)]
    events = [event("click", "p1", "z", 3, 2, "s")]
    con = open_reader(build_store(tmp_path / "p.duckdb", queries, events, []))
    try:
        load_searches(con)
        base0 = online_metrics(con, n_boot=100)["shop/ranker=a"]
        base1 = online_metrics(con, position_base_by_application={"shop": 1}, n_boot=100)["shop/ranker=a"]
    finally:
        con.close()
    assert base0.metrics["rr_first_click"].value == pytest.approx(1 / 4)
    assert base1.metrics["rr_first_click"].value == pytest.approx(1 / 3)
    assert base0.notes["clicks_off_ranking"] == 1


def test_online_before_searches_is_an_error(tmp_path):
    con = open_reader(build_store(tmp_path / "n.duckdb"))
    try:
        with pytest.raises(OnlineError, match="load_searches"):
            online_metrics(con)
    finally:
        con.close()


def test_esci_sample_counts_match_the_raw_file(esci_con):
    # independent count from the raw _bulk file: esci_ubi_sample events
    docs = [orjson.loads(line) for line in shared_path(SAMPLE_LOG).read_bytes().splitlines()[1::2]]
    esci = [d for d in docs if d.get("application") == "esci_ubi_sample" and "action_name" in d]
    clicks = [d for d in esci if d["action_name"] == "click"]
    impressions = [d for d in esci if d["action_name"] == "impression"]
    clicked_searches = {d["query_id"] for d in clicks}
    clicked_pairs = {(d["query_id"], d["event_attributes"]["object"]["object_id"]) for d in clicks}
    assert (len(impressions), len(clicks), len(clicked_searches)) == (1000, 60, 55)

    load_searches(esci_con)
    m = online_metrics(esci_con, n_boot=200)["esci_ubi_sample"].metrics
    assert m["ctr"].value == pytest.approx(len(clicked_pairs) / len(impressions))  # 60 / 1000
    assert m["abandonment"].value == pytest.approx((200 - 55) / 200)
    assert m["clicks_per_search"].value == pytest.approx(60 / 200)
    assert m["zero_result_rate"].value == 0.0
