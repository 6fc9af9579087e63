"""Sessions from the store: exact counts on the real sample, an independent reference, and hand-made logs."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ubi_records import build_sample_store, build_store, make_event, make_query

from ubi_pipeline.processors.clicks.ordinal_base import suggestion
from ubi_pipeline.processors.clicks.sessions import (
    SessionError,
    iter_sessions,
    load_sessions,
    patterns_from_sessions,
    read_sessions,
)
from ubi_pipeline.processors.clicks.stats import cells_from_sessions, ubm_cells_from_sessions
from ubi_pipeline.schemas.sessions import Session
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.text import normalize_query
from ubi_pipeline.store.client import open_reader


@pytest.fixture(scope="module")
def sample_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sample_store(tmp_path_factory.mktemp("sample") / "ubi.duckdb")


@pytest.fixture(scope="module")
def sample(sample_db: Path):
    # detection off: the counts below are those of base 0 everywhere (test_sample_base_detection has auto)
    return read_sessions(sample_db, FIXED_BASE)


FIXED_BASE = Settings(position_base_auto=False)


# ----------------------------------------------------------------------------- an independent reference

def reference(db: Path, settings: Settings, k: int) -> dict[str, Any]:
    """The documented session rules re-implemented record by record in plain Python (slow, obviously correct).

    Reads the raw stored rows; shares no code with ``ubi_pipeline.processors.clicks.sessions``.
    """
    con = duckdb.connect(str(db), read_only=True)
    qrows = con.execute("SELECT query_key, query_id, user_query, client_id, application, timestamp, "
                        "query_response_hit_ids FROM ubi_queries").fetchall()
    erows = con.execute("SELECT rowid, action_name, query_id, nullif(object_id, ''), position_ordinal, timestamp, "
                        "application FROM ubi_events").fetchall()
    con.close()
    by_qid: dict[str, list[tuple]] = defaultdict(list)
    for r in qrows:
        by_qid[r[1]].append(r)
    search = {}
    for qid, recs in by_qid.items():
        recs.sort(key=lambda r: (not r[6], r[5] is None, r[5] or datetime.min, r[0]))
        search[qid] = recs[0]
    click_names = set(settings.click_actions)

    def base(app: str | None) -> int:
        return settings.position_base_by_application.get(app, settings.position_base)

    def ord_rank(e: tuple, app: str | None) -> int | None:
        if e[4] is None or e[4] - base(app) < 0:
            return None
        return e[4] - base(app) + 1

    imps = [e for e in erows if e[1] == settings.impression_action]
    clicks = [e for e in erows if e[1] in click_names]
    q: Counter[str] = Counter()
    q["impression_events"], q["click_events"] = len(imps), len(clicks)
    # impressions -> ranks
    placed_imp: dict[str, list[tuple[str, int, datetime]]] = defaultdict(list)
    imp_by_q: dict[str, list[tuple]] = defaultdict(list)
    for e in imps:
        if e[3] is None:
            q["impressions_without_object_id"] += 1
        elif e[2] not in search:
            q["impressions_without_search"] += 1
        else:
            imp_by_q[e[2]].append(e)
    for qid, evs in imp_by_q.items():
        s = search[qid]
        hits = s[6] or None
        arrival = 0  # impressions without hit list and ordinal take their place in order of arrival
        for e in sorted(evs, key=lambda e: (e[5], e[0])):
            app = e[6] or s[4]
            if hits:
                rank = hits.index(e[3]) + 1 if e[3] in hits else None
                if rank is None:
                    q["impressions_outside_ranking"] += 1
                if rank and e[4] is not None:
                    q["impression_rank_checked"] += 1
                    q["impression_rank_disagreements"] += rank != ord_rank(e, app)
            elif e[4] is not None and e[4] - base(app) < 0:
                rank = None
                q["impressions_bad_ordinal"] += 1
            elif e[4] is not None:
                rank = ord_rank(e, app)
            else:
                arrival += 1
                rank = arrival
            if rank:
                placed_imp[qid].append((e[3], rank, e[5]))
    shown: dict[str, dict[str, int]] = {}
    for qid, rows in placed_imp.items():
        first: dict[str, tuple[int, datetime]] = {}
        for doc, rank, t in rows:
            r0, t0 = first.get(doc, (rank, t))
            first[doc] = (min(r0, rank), min(t0, t))
        q["duplicate_impressions"] += len(rows) - len(first)
        at_rank: dict[int, tuple[datetime, str]] = {}
        for doc, (rank, t) in first.items():
            if rank not in at_rank or (t, doc) < at_rank[rank]:
                at_rank[rank] = (t, doc)
        q["impression_rank_collisions"] += len(first) - len(at_rank)
        shown[qid] = {doc: rank for rank, (_, doc) in at_rank.items()}
    q["impressions_displayed"] = sum(len(v) for v in shown.values())
    for qid, s in search.items():
        if qid not in shown and s[6]:
            docs: dict[str, int] = {}
            for i, d in enumerate(s[6]):
                if d and d not in docs:
                    docs[d] = i + 1
            shown[qid] = docs
    # clicks
    clicked: dict[str, set[str]] = defaultdict(set)
    candidates: dict[str, dict[str, tuple[int, datetime]]] = defaultdict(dict)
    on_displayed: list[tuple] = []
    for e in clicks:
        app = e[6] or (search[e[2]][4] if e[2] in search else None)
        if e[3] is None:
            q["clicks_without_object_id"] += 1
        elif e[2] not in search:
            q["clicks_without_search"] += 1
        elif e[2] not in shown:
            q["clicks_on_search_without_ranking"] += 1
        elif e[3] in shown[e[2]]:
            on_displayed.append(e)
            if e[4] is not None:
                q["click_rank_checked"] += 1
                q["click_rank_disagreements"] += shown[e[2]][e[3]] != ord_rank(e, app)
        elif ord_rank(e, app) is not None:
            r, t = candidates[e[2]].get(e[3], (ord_rank(e, app), e[5]))
            candidates[e[2]][e[3]] = (min(r, ord_rank(e, app)), min(t, e[5]))
    for qid, docs in candidates.items():
        taken = set(shown[qid].values())
        best: dict[int, tuple[datetime, str]] = {}
        for doc, (rank, t) in docs.items():
            if rank not in taken and (rank not in best or (t, doc) < best[rank]):
                best[rank] = (t, doc)
        for rank, (_, doc) in best.items():
            shown[qid][doc] = rank
            q["clicks_placed_by_ordinal"] += 1
    for e in clicks:
        if e[3] is not None and e[2] in shown and e[3] in shown[e[2]]:
            clicked[e[2]].add(e[3])
            q["clicks_displayed"] += 1
    q["repeat_clicks"] = q["clicks_displayed"] - sum(len(v) for v in clicked.values())
    q["clicks_on_undisplayed"] = (q["click_events"] - q["clicks_without_object_id"] - q["clicks_without_search"]
                                  - q["clicks_on_search_without_ranking"] - q["clicks_displayed"])
    # filters and cells
    first_event: dict[str, datetime] = {}
    for e in imps + clicks:
        if e[2] in search:
            first_event[e[2]] = min(first_event.get(e[2], e[5]), e[5])
    when = {qid: s[5] or first_event.get(qid) for qid, s in search.items()}
    per_client: dict[str, list[datetime]] = defaultdict(list)
    for qid, s in search.items():
        if s[3] is not None and when[qid] is not None:
            per_client[s[3]].append(when[qid])
    bots = {c for c, times in per_client.items()
            if max(sum(t <= u <= t + timedelta(seconds=60) for u in times) for t in times)
            > settings.max_client_queries_per_minute}
    cells: Counter[tuple[str, str, int, bool]] = Counter()
    kept = 0
    dropped: Counter[str] = Counter()
    for qid, docs in shown.items():
        s = search[qid]
        text = normalize_query(s[2])
        n_clicked = sum(d in clicked[qid] for d in docs)
        if not text:
            dropped["empty"] += 1
            continue
        if s[3] in bots:
            dropped["bot"] += 1
            continue
        if settings.filter_click_all and len(docs) >= settings.click_all_min_results and n_clicked == len(docs):
            dropped["click_all"] += 1
            continue
        within = {d: r for d, r in docs.items() if r <= k}
        kept += bool(within)
        for d, r in within.items():
            cells[(text, d, r, d in clicked[qid])] += 1
    return {"quality": q, "cells": cells, "sessions": kept, "dropped": dropped}


def cells_as_counter(data) -> Counter[tuple[str, str, int, bool]]:
    out: Counter[tuple[str, str, int, bool]] = Counter()
    c, p = data.cells, data.pairs
    for pair, rank, imps, clicks in zip(c.pair, c.rank, c.impressions, c.clicks, strict=True):
        key = (p.queries[pair], p.doc_ids[pair], int(rank))
        if clicks:
            out[(*key, True)] = int(clicks)
        if imps - clicks:
            out[(*key, False)] = int(imps - clicks)
    return out


# ----------------------------------------------------------------------------- the real sample

def test_sample_quality_counts_are_exact(sample) -> None:
    q = sample.quality
    # From the file itself (docs/ubi.md, SOURCES.md): 473 query records over 284 distinct query_ids
    # (200 esci_ubi_sample + 84 Chorus), so 189 are extra sub-search records; 1,999 impression events
    # (1,000 esci + 999 Chorus) and 287 click events (60 esci + 227 Chorus; ubi-demo's item_click and
    # global_click are not clicks by default). Everything below also equals the record-by-record
    # reference in test_sample_matches_independent_reference.
    assert (q.query_records, q.searches, q.duplicate_query_records) == (473, 284, 189)
    assert (q.impression_events, q.click_events) == (1999, 287)
    # 3 Chorus query_ids logged two non-empty hit lists; 6 Chorus searches have neither a hit list nor impressions
    assert (q.searches_with_several_rankings, q.searches_without_ranking) == (3, 6)
    # 200 esci searches + 56 Chorus ones ranked by impressions, 22 Chorus ones by their hit list alone
    assert (q.searches_ranked_by_impressions, q.searches_ranked_by_hit_list) == (256, 22)
    assert (q.impressions_without_object_id, q.impressions_without_search, q.impressions_outside_ranking) == (0, 67, 67)
    assert (q.duplicate_impressions, q.impression_rank_collisions, q.impressions_displayed) == (0, 0, 1865)
    assert 0 + 67 + 67 + 0 + 0 + 0 + 1865 == q.impression_events  # the split is exact
    # Chorus ordinals count from 1 until February 2025 and from 0 (first result still 1) after: with base 0,
    # 503 of the 865 in-list impressions and 115 of 226 clicks disagree with the hit-list rank.
    assert (q.impression_rank_checked, q.impression_rank_disagreements) == (865, 503)
    assert (q.click_rank_checked, q.click_rank_disagreements) == (226, 115)
    assert q.ordinal_base_evidence == {"Chorus": {"base0": 421, "base1": 638, "checked": 1060}}
    assert (q.clicks_without_object_id, q.clicks_without_search, q.clicks_on_search_without_ranking) == (0, 20, 0)
    assert (q.clicks_on_undisplayed, q.clicks_displayed, q.clicks_placed_by_ordinal, q.repeat_clicks) == (18, 249, 13, 76)
    assert 0 + 20 + 0 + 18 + 249 == q.click_events


def test_sample_sessions_and_cells_are_exact(sample) -> None:
    f = sample.filters
    # 256 + 22 ranked searches; no client exceeds 60 searches a minute, none clicked everything
    assert (f.ranked_searches, f.sessions, f.bot_searches, f.click_all_searches, f.empty_query_searches) == (278, 278, 0, 0, 0)
    assert (f.impressions, f.clicks, f.impressions_beyond_k, f.clicks_beyond_k) == (1703, 140, 579, 33)
    assert (len(sample.pairs), len(set(sample.pairs.queries))) == (1003, 161)
    c, p = sample.cells, sample.pairs
    assert (len(c.pair), int(c.impressions.sum()), int(c.clicks.sum())) == (1003, 1703, 140)

    def cell(i: int) -> tuple:
        return (p.queries[c.pair[i]], p.doc_ids[c.pair[i]], int(c.rank[i]), int(c.impressions[i]), int(c.clicks[i]))

    # first, tenth and last cell in (query, doc, rank) order; each equals the reference's count for that key
    assert cell(0) == ("30 inch ceiling fan without light", "B000FVKJBY", 2, 1, 0)
    assert cell(9) == ("3d printer", "B081W2QRQB", 3, 1, 0)
    assert cell(1002) == ("yoga mat", "B07SD42ZD8", 2, 2, 0)
    # 210 distinct patterns; the heaviest: six "wireless earbuds" searches with the same ten docs, no click
    pt = sample.patterns
    assert (pt.docs.shape, pt.n_sessions) == ((210, 10), 278)
    top = int(np.argmax(pt.weight))
    assert (pt.weight[top], p.queries[pt.docs[top, 0]], bool(pt.clicks[top].any())) == (6, "wireless earbuds", False)


def test_sample_matches_independent_reference(sample_db: Path, sample) -> None:
    ref = reference(sample_db, FIXED_BASE, 10)
    assert cells_as_counter(sample) == ref["cells"]
    assert sample.filters.sessions == ref["sessions"]
    q = sample.quality.as_dict()
    for key, value in ref["quality"].items():
        assert q[key] == value, key


def test_sql_cells_equal_cells_from_patterns(sample) -> None:
    """The SQL aggregation and the numpy aggregation of the deduplicated patterns are the same statistics."""
    for got, want in ((sample.cells, cells_from_sessions(sample.patterns)),
                      (sample.ubm_cells, ubm_cells_from_sessions(sample.patterns))):
        for name in ("pair", "rank", "impressions", "clicks"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert np.array_equal(sample.ubm_cells.prev_click, ubm_cells_from_sessions(sample.patterns).prev_click)


def test_iter_sessions_gives_the_same_patterns(sample_db: Path, sample) -> None:
    con = open_reader(sample_db)
    try:
        sessions = list(iter_sessions(con, FIXED_BASE))
        rebuilt = patterns_from_sessions(sessions, 10)
        # temporary tables are gone afterwards: the connection can build again
        assert load_sessions(con, FIXED_BASE).filters.sessions == 278
    finally:
        con.close()
    assert len(sessions) == 278
    assert sessions[0].query == "futon frames full size without mattress"  # the earliest search (2024-12-10)
    for name in ("query", "docs", "clicks", "weight"):
        assert np.array_equal(getattr(rebuilt, name), getattr(sample.patterns, name)), name
    assert list(rebuilt.pairs.doc_ids) == list(sample.pairs.doc_ids)


def test_sample_base_detection(sample_db: Path) -> None:
    """Auto-detection (the default) picks base 1 for Chorus from its ordinals; explicit settings win."""
    auto = read_sessions(sample_db, Settings())
    chorus = auto.quality.ordinal_bases["Chorus"]
    # the evidence is the base-independent count above: 421 ordinals fit base 0, 638 base 1, of 1,060
    assert (chorus.evidence.base0, chorus.evidence.base1, chorus.evidence.checked) == (421, 638, 1060)
    assert (chorus.base, chorus.how, chorus.disagrees) == (1, "detected", False)
    # with base 1 for Chorus, 51 of the 226 checked clicks disagree (issue 12; 115 with base 0), and every
    # count equals the record-by-record reference run with the setting {"Chorus": 1}
    assert (auto.quality.click_rank_disagreements, auto.quality.click_rank_checked) == (51, 226)
    ref = reference(sample_db, Settings(position_base_by_application={"Chorus": 1}), 10)
    assert cells_as_counter(auto) == ref["cells"]
    for key, value in ref["quality"].items():
        assert auto.quality.as_dict()[key] == value, key
    # an explicit base (UBI_POSITION_BASE or --position-base 0) turns detection off and says the data disagrees
    fixed = read_sessions(sample_db, Settings(position_base=0)).quality
    assert (fixed.ordinal_bases["Chorus"].base, fixed.ordinal_bases["Chorus"].disagrees) == (0, True)
    assert fixed.click_rank_disagreements == 115
    assert suggestion(fixed.ordinal_bases, Settings(position_base=0)) == \
        """UBI_POSITION_BASE_BY_APPLICATION='{"Chorus": 1}'"""
    assert suggestion(auto.quality.ordinal_bases, Settings()) is None
    # a per-application entry wins over detection, even against the data
    pinned = read_sessions(sample_db, Settings(position_base_by_application={"Chorus": 0})).quality
    assert (pinned.ordinal_bases["Chorus"].how, pinned.ordinal_bases["Chorus"].disagrees) == (
        "UBI_POSITION_BASE_BY_APPLICATION", True)
    # `--position-base auto` beats UBI_POSITION_BASE (a flag is more explicit than the environment)
    flagged = read_sessions(sample_db, Settings(position_base=0, position_base_auto=True)).quality
    assert flagged.ordinal_bases["Chorus"].base == 1


def test_base_override_and_item_clicks_change_the_counts(sample_db: Path) -> None:
    data = read_sessions(sample_db, Settings(position_base_by_application={"Chorus": 1},
                                             click_actions=["click", "item_click", "global_click"]))
    ref = reference(sample_db, Settings(position_base_by_application={"Chorus": 1},
                                        click_actions=["click", "item_click", "global_click"]), 10)
    # ubi-demo's 72 item/global clicks have no query record: they only add to clicks without a search
    assert data.quality.click_events == 287 + 11 + 61
    assert data.quality.clicks_without_search == 20 + 72
    assert data.quality.click_rank_disagreements == ref["quality"]["click_rank_disagreements"]
    assert cells_as_counter(data) == ref["cells"]


# ----------------------------------------------------------------------------- hand-made logs

def _load(tmp_path: Path, queries, events, settings: Settings | None = None, k: int = 10):
    db = build_store(tmp_path / "t.duckdb", queries, events)
    return read_sessions(db, settings or Settings(), max_rank=k), db


def test_click_rank_from_hit_list_and_ordinal_disagreement(tmp_path: Path) -> None:
    queries = [make_query("s1", "Red  Shoes", ["a", "b", "c"])]
    events = [
        make_event("click", "s1", "b", 0, at=2),  # in list at rank 2; ordinal 0 -> rank 1 with base 0: disagree
        make_event("click", "s1", "c", 2, at=3),  # in list at rank 3; ordinal 2 -> rank 3: agree
        make_event("click", "s1", "c", 2, at=4),  # second click on c: one click in the cells, counted as repeat
    ]
    data, _ = _load(tmp_path, queries, events)
    q = data.quality
    assert (q.click_rank_checked, q.click_rank_disagreements, q.repeat_clicks) == (3, 1, 1)
    assert q.searches_ranked_by_hit_list == 1
    # cells: ("red shoes", a, 1) shown, not clicked; b at 2 clicked; c at 3 clicked (query normalised)
    got = cells_as_counter(data)
    assert got == Counter({("red shoes", "a", 1, False): 1, ("red shoes", "b", 2, True): 1,
                           ("red shoes", "c", 3, True): 1})


def test_impressions_rank_by_ordinal_base_and_time(tmp_path: Path) -> None:
    queries = [make_query("s1", "q1", None, application="zero"), make_query("s2", "q2", None, application="one"),
               make_query("s3", "q3", None, application="zero")]
    events = [
        make_event("impression", "s1", "x", 1, at=1, application="zero"),  # base 0: rank 2
        make_event("impression", "s1", "y", 0, at=2, application="zero"),  # rank 1
        make_event("impression", "s2", "x", 1, at=1, application="one"),  # base 1 for "one": rank 1
        make_event("impression", "s2", "z", 0, at=2, application="one"),  # below base 1: dropped, counted
        make_event("impression", "s3", "u", None, at=5, application="zero"),  # no ordinals: arrival order
        make_event("impression", "s3", "v", None, at=3, application="zero"),
        make_event("impression", "s3", "v", None, at=6, application="zero"),  # v again: keeps rank 1
    ]
    data, _ = _load(tmp_path, queries, events, Settings(position_base_by_application={"one": 1}))
    assert cells_as_counter(data) == Counter({("q1", "y", 1, False): 1, ("q1", "x", 2, False): 1,
                                              ("q2", "x", 1, False): 1, ("q3", "v", 1, False): 1,
                                              ("q3", "u", 2, False): 1})
    q = data.quality
    assert (q.impressions_bad_ordinal, q.duplicate_impressions, q.impressions_displayed) == (1, 1, 5)


def test_impressions_outside_hit_list_and_collisions(tmp_path: Path) -> None:
    queries = [
        make_query("s1", "q", [], at=0, response_id="r0"),  # sub-search without hits: not the session's record
        make_query("s1", "q", ["a", "b", "c"], at=1, response_id="r1"),
        make_query("s2", "p", None),
    ]
    events = [
        make_event("impression", "s1", "a", 1, at=2),  # hit list says rank 1 (ordinal says 2: disagreement)
        make_event("impression", "s1", "zz", 0, at=3),  # not in the hit list: another sub-search's display
        make_event("impression", "s2", "m", 0, at=2),  # rank 1
        make_event("impression", "s2", "n", 0, at=3),  # also rank 1, later: collision, dropped
    ]
    data, _ = _load(tmp_path, queries, events)
    q = data.quality
    assert (q.duplicate_query_records, q.impressions_outside_ranking, q.impression_rank_collisions) == (1, 1, 1)
    assert (q.impression_rank_checked, q.impression_rank_disagreements) == (1, 1)
    # s1 has a placed impression, so only "a" is displayed (impressions say what was seen, not the hit list)
    assert cells_as_counter(data) == Counter({("q", "a", 1, False): 1, ("p", "m", 1, False): 1})


def test_clicks_on_undisplayed_docs_are_placed_or_dropped(tmp_path: Path) -> None:
    queries = [make_query("s1", "q", None), make_query("s2", "empty", None)]
    events = [
        make_event("impression", "s1", "a", 0, at=1),
        make_event("impression", "s1", "b", 1, at=1.5),
        make_event("click", "s1", "c", 2, at=2),  # not impressed, rank 3 free: placed there
        make_event("click", "s1", "d", 0, at=3),  # not impressed, rank 1 taken by a: dropped
        make_event("click", "s1", "e", None, at=4),  # not impressed, no ordinal: dropped
        make_event("click", "s1", None, 1, at=5),  # no object id
        make_event("click", "nope", "a", 0, at=6),  # no such search
        make_event("click", None, "a", 0, at=7),  # no query id at all
        make_event("click", "s2", "a", 0, at=8),  # s2 displayed nothing: search without ranking
    ]
    data, _ = _load(tmp_path, queries, events)
    q = data.quality
    assert (q.clicks_placed_by_ordinal, q.clicks_on_undisplayed, q.clicks_without_object_id) == (1, 2, 1)
    assert (q.clicks_without_search, q.clicks_on_search_without_ranking, q.searches_without_ranking) == (2, 1, 1)
    assert data.filters.clicks_without_search == 2
    assert cells_as_counter(data) == Counter({("q", "a", 1, False): 1, ("q", "b", 2, False): 1,
                                              ("q", "c", 3, True): 1})


def test_filters_bots_click_all_and_empty_queries(tmp_path: Path) -> None:
    queries, events = [], []
    # the bot: 61 searches within 60 s (one more than the default limit of 60 per minute)
    for i in range(61):
        queries.append(make_query(f"b{i}", "cheap", ["a", "b"], at=i * 0.9, client_id="bot"))
    # a person: 61 searches spread over an hour, never more than 1 per minute
    for i in range(61):
        queries.append(make_query(f"h{i}", "cheap", ["a", "b"], at=i * 61.0, client_id="human"))
    queries.append(make_query("all", "cheap", ["a", "b"], at=5000, client_id="other"))  # both results clicked
    events += [make_event("click", "all", "a", 0, at=5001), make_event("click", "all", "b", 1, at=5002)]
    queries.append(make_query("one", "single", ["a"], at=5000, client_id="other"))  # one result, clicked: kept
    events.append(make_event("click", "one", "a", 0, at=5001))
    queries.append(make_query("blank", "   ", ["a"], at=5000, client_id="other"))
    queries.append(make_query("b-none", "cheap", None, at=30.0, client_id="bot"))  # the bot's unranked search
    data, db = _load(tmp_path, queries, events)
    f = data.filters
    assert (f.bot_clients, f.bot_searches, f.click_all_searches, f.empty_query_searches) == (1, 61, 1, 1)
    # 61 bot + 61 human + 3 others ranked; kept: the 61 human searches and "single"
    assert (f.ranked_searches, f.sessions) == (125, 61 + 1)
    # the verdict per search (issue 24: the report's online metrics leave out exactly these): the 61 bot searches,
    # "all" and "blank", by query_id; and the bot's unranked search, which no filter count holds (it is not ranked),
    # but which is a bot's search all the same
    dropped = dict(zip(data.dropped.column("query_id").to_pylist(), data.dropped.column("reason").to_pylist(), strict=True))
    assert dropped == {**{f"b{i}": "bot" for i in range(61)}, "b-none": "bot", "all": "click_all",
                       "blank": "empty_query"}
    # the same log with the filters relaxed keeps everything but the empty query
    relaxed = read_sessions(db, Settings(max_client_queries_per_minute=1000, filter_click_all=False))
    assert (relaxed.filters.sessions, relaxed.filters.bot_searches, relaxed.filters.click_all_searches) == (124, 0, 0)
    # identical sessions collapse into weighted patterns: 61 human "cheap" sessions are one pattern
    assert sorted(data.patterns.weight.tolist()) == [1, 61]


def test_ubm_previous_click_and_truncation(tmp_path: Path) -> None:
    queries = [make_query("s1", "q", ["a", "b", "c", "d"])]
    events = [make_event("click", "s1", "a", 0, at=2), make_event("click", "s1", "c", 2, at=3),
              make_event("click", "s1", "d", 3, at=4)]
    data, _ = _load(tmp_path, queries, events, k=3)
    u = data.ubm_cells
    # ranks 1..3 kept (d at 4 is cut and counted); previous click before rank k: 0, 1, 1
    assert list(zip(u.rank.tolist(), u.prev_click.tolist(), u.clicks.tolist(), strict=True)) == [(1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert (data.filters.impressions_beyond_k, data.filters.clicks_beyond_k) == (1, 1)


def test_patterns_from_sessions_merges_and_validates() -> None:
    s = [Session("1", "q", ("a", "b"), (1, 2), (True, False)), Session("2", "q", ("a", "b"), (1, 2), (True, False)),
         Session("3", "q", ("b", "z"), (1, 12), (False, True))]
    p = patterns_from_sessions(s, max_rank=10)
    assert p.weight.tolist() == [2, 1] or p.weight.tolist() == [1, 2]
    assert p.n_sessions == 3 and list(p.pairs.doc_ids) == ["a", "b"]  # z only at rank 12 > K: cut
    with pytest.raises(SessionError):
        patterns_from_sessions([Session("x", "q", ("a", "b"), (1, 1), (False, False))])


def test_missing_store_tables_is_a_typed_error(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "empty.duckdb"))
    with pytest.raises(SessionError, match="ubi_queries"):
        load_sessions(con)
    con.close()


_session = st.builds(
    lambda q, docs, clicks: Session("x", q, tuple(docs), tuple(range(1, len(docs) + 1)), tuple(clicks[: len(docs)])),
    st.sampled_from(["q1", "q2"]),
    st.lists(st.sampled_from("abcdef"), min_size=1, max_size=6, unique=True),
    st.lists(st.booleans(), min_size=6, max_size=6),
)


@given(st.lists(_session, min_size=1, max_size=30))
def test_pattern_dedup_laws(sessions: list[Session]) -> None:
    once = patterns_from_sessions(sessions, max_rank=4)
    twice = patterns_from_sessions(sessions + sessions, max_rank=4)
    # merging is idempotent up to weight: the same patterns, every weight doubled
    assert np.array_equal(once.docs, twice.docs) and np.array_equal(twice.weight, 2 * once.weight)
    # the weighted cells equal plain counting over the sessions
    want: Counter[tuple[str, str, int, bool]] = Counter(
        (s.query, d, r, c) for s in sessions for d, r, c in zip(s.doc_ids, s.ranks, s.clicked, strict=True) if r <= 4)
    cells = cells_from_sessions(once)
    got: Counter[tuple[str, str, int, bool]] = Counter()
    for pair, rank, imps, clicks in zip(cells.pair, cells.rank, cells.impressions, cells.clicks, strict=True):
        key = (once.pairs.queries[pair], once.pairs.doc_ids[pair], int(rank))
        got[(*key, True)] += int(clicks)
        got[(*key, False)] += int(imps - clicks)
    assert +got == want


# ----------------------------------------------------------------------------- the hashed event scan

def _same_sessions(a, b) -> None:
    """Every statistic and count of two SessionData equal (pairs, cells, UBM cells, patterns, quality, filters)."""
    assert list(a.pairs.queries) == list(b.pairs.queries) and list(a.pairs.doc_ids) == list(b.pairs.doc_ids)
    for got, want, names in ((a.cells, b.cells, ("pair", "rank", "impressions", "clicks")),
                             (a.ubm_cells, b.ubm_cells, ("pair", "rank", "prev_click", "impressions", "clicks")),
                             (a.patterns, b.patterns, ("query", "docs", "clicks", "weight"))):
        for name in names:
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert a.quality.as_dict() == b.quality.as_dict()
    assert a.filters.as_dict() == b.filters.as_dict()


def _strings_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the session build take its fallback: hit ranks from the lists of strings, as before hashing."""
    import ubi_pipeline.processors.clicks.sessions as sessions

    monkeypatch.setattr(sessions, "_hashes_distinct", lambda con: False)


def test_hashed_scan_equals_string_scan_on_the_sample(sample_db: Path, sample, monkeypatch) -> None:
    """The hashed event scan (default) and the scan over the hit lists' strings give the same statistics."""
    _strings_only(monkeypatch)
    _same_sessions(sample, read_sessions(sample_db, FIXED_BASE))


def test_hashed_scan_equals_string_scan_on_edge_cases(tmp_path: Path, monkeypatch) -> None:
    """Repeated docs in a hit list (first rank wins), empty object ids, docs outside the list, clicks placed by
    ordinal: the same ranks and counts either way (the counts were checked by hand: 2 ranks checked, 1 outside)."""
    queries = [make_query("s1", "q", ["a", "b", "a", ""]), make_query("s2", "p", ["x", "y"])]
    events = [
        make_event("impression", "s1", "a", 0, at=1),  # rank 1 (its first place in the list), ordinal agrees
        make_event("impression", "s1", "b", 1, at=2),  # rank 2, ordinal agrees
        make_event("impression", "s1", "", 3, at=3),  # no object id
        make_event("impression", "s2", "zz", 0, at=2),  # outside s2's hit list
        make_event("click", "s1", "a", 0, at=4),
        make_event("click", "s2", "w", 4, at=5),  # undisplayed doc, placed at its free ordinal rank 5
    ]
    hashed, db = _load(tmp_path, queries, events)
    q = hashed.quality
    assert (q.impression_rank_checked, q.impressions_outside_ranking, q.impressions_without_object_id) == (2, 1, 1)
    assert q.clicks_placed_by_ordinal == 1
    _strings_only(monkeypatch)
    _same_sessions(hashed, read_sessions(db, Settings(), max_rank=10))


def test_hash_check_counts_distinct_values_and_null() -> None:
    """The check's counting, with a deliberately weak hash (the string's length; NULL's is -1, as DuckDB's hash
    of NULL is a number too) standing in for the 64-bit one."""
    from ubi_pipeline.processors.clicks.sessions import _HASHES_DISTINCT

    assert "hash(d)" in _HASHES_DISTINCT
    weak = _HASHES_DISTINCT.replace("hash(d)", "coalesce(length(d), -1)")
    con = duckdb.connect()
    for events, hits, want in ((["ab", "c"], [["ab", "xyz"]], True),  # lengths 2, 1, 3: distinct
                               (["ab", "cd"], [["ab"]], False),  # "ab" and "cd" share length 2
                               (["ab", None], [["ab", None]], True),  # NULL is one value, hashed to -1
                               (["a", None], [["bb"], [None]], True),
                               (["abc", None], [["d", "ef"]], True),
                               (["a", "a"], [["a", "a"]], True)):  # repeats are one value
        con.execute("CREATE OR REPLACE TEMP TABLE _ubi_ev AS SELECT unnest($e::VARCHAR[]) AS object_id", {"e": events})
        con.execute("CREATE OR REPLACE TEMP TABLE _ubi_hits AS SELECT unnest($h::VARCHAR[][]) AS hits", {"h": hits})
        assert con.execute(weak).fetchall()[0][0] is want, (events, hits)


# ----------------------------------------------------------------------------- patterns filled batch by batch

@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_patterns_filled_in_batches_are_the_same(sample_db: Path, sample, monkeypatch, batch: int) -> None:
    """The [n, K] pattern arrays filled from the signature codes a few rows at a time (1: every code its own
    batch; 7: batches that split a pattern's ranks) equal those of one batch, and the patterns built in Python
    from the same sessions (``iter_sessions``), with and without a held-out split."""
    import ubi_pipeline.processors.clicks.sessions as sessions

    held = read_sessions(sample_db, FIXED_BASE, holdout=0.3)
    monkeypatch.setattr(sessions, "PATTERN_BATCH", batch)
    _same_sessions(read_sessions(sample_db, FIXED_BASE), sample)
    small = read_sessions(sample_db, FIXED_BASE, holdout=0.3)
    _same_sessions(small, held)
    assert np.array_equal(small.held_out, held.held_out)
    con = open_reader(sample_db)
    try:
        rebuilt = patterns_from_sessions(list(iter_sessions(con, FIXED_BASE)), 10)
    finally:
        con.close()
    for name in ("query", "docs", "clicks", "weight"):
        assert np.array_equal(getattr(rebuilt, name), getattr(sample.patterns, name)), name
    # the held-out split keeps every search once: its two halves add up to the whole log's patterns
    train, test = small.split()
    assert train.n_sessions + test.n_sessions == sample.patterns.n_sessions == 278


def test_ubm_cells_are_summed_on_first_read(sample_db: Path) -> None:
    """The session build leaves UBM cells to the first reader (no fit needs them from here); they are then the
    patterns' own (``ubm_cells_from_sessions``) and kept, and a SessionData given them keeps those."""
    data = read_sessions(sample_db, FIXED_BASE)
    assert data.__dict__["_ubm_cells"] is None
    want = ubm_cells_from_sessions(data.patterns)
    got = data.ubm_cells
    for name in ("pair", "rank", "prev_click", "impressions", "clicks"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert data.ubm_cells is got and len(got.pair) > len(data.cells.pair)
    from dataclasses import replace

    given = replace(data, ubm_cells=want)
    assert given.ubm_cells is want
