"""The report reads its labels after its DuckDB steps (ubi_pipeline.reports.joint.build_report with a label loader), so the
labels and the search temp tables are never held at once; the report is the same either way.

Expected values come from the same report built the old way (labels given as a LabelSet), not from numbers
worked out here: what is tested is that reading the labels later changes nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from joint_fixtures import build_store, write_human

from ubi_pipeline.formats.qrels import load_qrels
from ubi_pipeline.processors.clicks.identifiability import PARTIAL, UNIDENTIFIED, Identifiability
from ubi_pipeline.processors.labels.merge import Label, LabelSet, labels_from_human, labels_from_store
from ubi_pipeline.reports.joint import ReportConfig, build_report
from ubi_pipeline.reports.recommend import withhold_unidentified, withhold_unidentified_in
from ubi_pipeline.reports.render.json_out import report_dict
from ubi_pipeline.reports.systems import drop_searches, prepare_searches
from ubi_pipeline.store.client import open_reader

SEARCH_TABLES = {"_ubi_records", "_ubi_inst", "_ubi_searches", "_ubi_search_events"}


def _temp_tables(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}


def _comparable(report) -> dict:
    out = report_dict(report)
    out.pop("created_at")
    return out


def test_labels_read_late_give_the_same_report_and_find_no_search_table(tmp_path) -> None:
    db = build_store(tmp_path / "ubi.duckdb")
    human = load_qrels(write_human(tmp_path / "h.jsonl")).human_judgments()
    config = ReportConfig(baseline="shop/ranker=a", n_boot=200, n_perm=200)
    con = open_reader(db)
    seen: list[set[str]] = []
    try:
        early = LabelSet().add(labels_from_store(con)).add(labels_from_human(human))
        ref = build_report(con, early, config, inputs={"db": str(db)})

        def late() -> LabelSet:
            seen.append(_temp_tables(con))
            return LabelSet().add(labels_from_store(con)).add(labels_from_human(human))

        got = build_report(con, late, config, inputs={"db": str(db)})
        after = _temp_tables(con)
    finally:
        con.close()
    assert len(seen) == 1  # read once
    assert not seen[0] & SEARCH_TABLES  # dropped before the labels were read
    assert not after & SEARCH_TABLES
    assert len(ref.label_pairs) > 3 and ref.online and ref.comparisons  # the world has all of these to compare
    assert _comparable(got) == _comparable(ref)


def test_prepare_searches_keeps_only_what_the_report_reads_and_drop_searches_drops_it(tmp_path) -> None:
    con = open_reader(build_store(tmp_path / "ubi.duckdb"))
    try:
        assert prepare_searches(con) == 9  # the hand world's nine searches (joint_fixtures docstring)
        assert _temp_tables(con) & SEARCH_TABLES == {"_ubi_searches", "_ubi_search_events"}
        drop_searches(con)
        assert not _temp_tables(con) & SEARCH_TABLES
        drop_searches(con)  # twice: nothing left to drop is not an error
    finally:
        con.close()


def _verdict(verdict: str) -> Identifiability:
    return Identifiability(verdict=verdict, max_rank=10, pairs=3, pairs_at_several_ranks=0, displayed_ranks=(1, 2),
                           linked_ranks=(1,), unlinked_ranks=(2,), weak_ranks=(), rank_links=())


def _labels() -> LabelSet:
    at = datetime(2025, 1, 1, tzinfo=UTC)
    return LabelSet().add([
        Label("q", "a", 2, "implicit:pbm", origin="store", judged_at=at),
        Label("q", "a", 3, "human", origin="file"),
        Label("q", "b", 1, "implicit:ctr", origin="store"),
        Label("q", "b", None, "implicit:pbm", origin="store"),
        Label("r", "c", 0, "implicit:dbn", origin="store"),
        Label("r", "c", 1, "implicit:pbm", origin="store"),
    ])


@pytest.mark.parametrize("verdict", [UNIDENTIFIED, PARTIAL])
def test_withholding_in_place_equals_withholding_into_a_copy(verdict) -> None:
    labels = _labels()
    kept, dropped = withhold_unidentified((lab for ls in labels.by_pair.values() for lab in ls), _verdict(verdict))
    copy = LabelSet().add(kept)
    in_place = _labels()
    assert withhold_unidentified_in(in_place, _verdict(verdict)) == dropped
    assert dict(in_place.by_pair) == dict(copy.by_pair)
    if verdict == UNIDENTIFIED:  # pbm and dbn are position-debiased; ctr and human keep their grades
        assert dropped == {"implicit:pbm": 2, "implicit:dbn": 1}
        assert [lab.grade for lab in in_place.by_pair[("q", "a")]] == [None, 3]
    else:
        assert dropped == {} and dict(in_place.by_pair) == dict(_labels().by_pair)
    assert withhold_unidentified_in(_labels(), None) == {}
