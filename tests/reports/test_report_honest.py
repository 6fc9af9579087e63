"""Reports that do not mislead (issue 12, item 4), on the ESCI sample as `ubi import` loads it.

Orders of systems only on shared queries, intervals only where n allows, data-quality warnings first in every
format, no confusion matrix of zeros, and no crash on any propensity input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from joint_fixtures import build_store, query, ubi, write_human

from tests.conftest import ESCI_JUDGMENTS, SAMPLE_LOG, shared_path
from ubi_pipeline.cli import main
from ubi_pipeline.reports.intervals import Interval, why_no_interval
from ubi_pipeline.reports.joint import OfflineResult, _shared_offline
from ubi_pipeline.reports.render.html import propensity_svg


@pytest.fixture(scope="module")
def esci(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ESCI sample through `ubi import`, with implicit:pbm judgments from `ubi process` (auto base)."""
    db = tmp_path_factory.mktemp("esci-honest") / "ubi.duckdb"
    assert main(["import", "--db", str(db), str(shared_path(SAMPLE_LOG))]) == 0
    assert main(["process", "--db", str(db), "--model", "pbm", "--json"]) == 0
    return db


def _write_report(db: Path, out_dir: Path, fmt: str, *extra: str) -> str:
    out = out_dir / f"r{len(list(out_dir.iterdir()))}.{fmt}"
    assert ubi(["report", "--db", str(db), "--qrels", str(shared_path(ESCI_JUDGMENTS)), "--format", fmt, "--out", str(out),
                *extra]) == 0
    return out.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def esci_report(esci: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """``esci_report(fmt, *extra)``: the text of ``ubi report`` on :func:`esci` in that format, written once per
    module for each (format, flags). The tests below read the same reports (11 before, 5 distinct): a report
    on the sample costs ~4 s of CPU in a full run, and the same store, labels and seed give the same report,
    so a shared copy checks exactly what a fresh one would."""
    out_dir = tmp_path_factory.mktemp("esci-reports")
    made: dict[tuple[str, ...], str] = {}

    def get(fmt: str, *extra: str) -> str:
        key = (fmt, *extra)
        if key not in made:
            made[key] = _write_report(esci, out_dir, fmt, *extra)
        return made[key]

    return get


def test_orders_only_on_shared_queries_and_intervals_only_where_n_allows(esci_report: Callable[..., str]) -> None:
    doc = json.loads(esci_report("json"))
    off = {(r["system"], r["source"]): r for r in doc["offline"]}
    # 8 of esci_ubi_sample's logged queries have ESCI judgments, none of Chorus's (test_report_command.py).
    # (Since main's PBM prior, implicit:pbm grades no positive on the sample, so merged adds nothing for Chorus;
    # the disjoint case "not ordered" is checked by hand in test_shared_offline_by_hand.)
    assert off[("esci_ubi_sample", "merged")]["queries_evaluated"] == 8
    assert off[("Chorus", "human")]["queries_evaluated"] == 0
    by_metric = {o["offline_metric"]: o for o in doc["orderings"]}
    human = by_metric["human/ndcg@10"]
    # before: an order that named Chorus, which has no evaluated query; now one system, said as such
    assert (human["offline_order"], human["offline_queries"]) == (["esci_ubi_sample"], 8)
    none = off[("Chorus", "human")]["aggregate"]["ndcg@10"]
    assert (none["n"], none["low"], none["high"], none["no_interval"]) == (0, None, None, "n = 0")
    eight = off[("esci_ubi_sample", "human")]["aggregate"]["ndcg@10"]
    assert eight["no_interval"] is None and eight["low"] < eight["value"] < eight["high"]
    text = esci_report("text")
    assert "human/ndcg@10         │ esci_ubi_sample only (8 queries; no other system has a labelled query)" in text
    assert "0.268 [0.171, 0.360]" in text  # test_report_command.py: nDCG@10 0.268483 over the 8 queries


def test_warnings_come_first_in_every_format(esci_report: Callable[..., str]) -> None:
    orphans = "ubi-demo: 429 events (71 query ids) have no query record"  # docs/ubi.md, SOURCES.md
    base = "ordinals of Chorus: 421 fit base 0, 638 fit base 1 (of 1,060 checked against hit lists); base in use: 1"
    text = esci_report("text")
    assert text.index(orphans) < text.index("Systems in the logs") and text.index(base) < text.index("┏")
    md = esci_report("md")
    assert md.index("## Data-quality warnings") < md.index("## Systems in the logs") and md.index(orphans) < md.index("## Systems")
    html = esci_report("html")
    assert html.index("Data-quality warnings") < html.index("<table") and html.index(orphans) < html.index("<table")
    doc = json.loads(esci_report("json"))
    assert any(w.startswith(base) for w in doc["warnings"]) and any(w.startswith(orphans) for w in doc["warnings"])
    assert not any("no query record" in n for n in doc["notes"])
    # an explicit base against the data: the warning says so and names the setting that fits
    text0 = esci_report("text", "--position-base", "0")
    assert "base in use: 0 (UBI_POSITION_BASE / --position-base); the data fits base 1 better" in text0
    assert """suggested setting: UBI_POSITION_BASE_BY_APPLICATION='{"Chorus": 1}'""" in text0


def test_no_empty_confusion_matrix(esci_report: Callable[..., str]) -> None:
    # no graded implicit:pbm pair of the sample has an ESCI judgment (agreement pairs = 0)
    doc = json.loads(esci_report("json"))
    a = doc["agreement"]["implicit:pbm"]
    assert (a["pairs"], a["confusion"], a["no_overlap"]) == (0, None, "no implicit label overlaps a human one")
    say = "implicit:pbm: no implicit label overlaps a human one, so there is no confusion matrix"
    text, md, html = (esci_report(f) for f in ("text", "md", "html"))
    assert say in text and "Confusion matrix: implicit:pbm" not in text
    assert say in md and "| human \\ implicit |" not in md
    assert say in html and "implicit:pbm grade" not in html  # the heat map's axis label


def _result(system: str, queries: list[str], values: list[float]) -> OfflineResult:
    iv = Interval(float(sum(values) / len(values)) if values else math.nan, math.nan, math.nan, len(values), "bootstrap")
    return OfflineResult(system=system, source="human", metrics=("ndcg@10",), query_ids=queries, queries=queries,
                         classes=[None] * len(queries), per_query={"ndcg@10": values}, aggregate={"ndcg@10": iv},
                         negatives=[], unlabelled_queries=0, run_queries=len(queries))


def test_shared_offline_by_hand() -> None:
    # a: q1 0.2, q2 0.9; b: q2 0.5, q3 0.1. Shared: q2 only, so a = 0.9 > b = 0.5 (their own means,
    # 0.55 and 0.30, would order them the same way for the wrong reason)
    values, n, why = _shared_offline([_result("a", ["q1", "q2"], [0.2, 0.9]), _result("b", ["q2", "q3"], [0.5, 0.1])],
                                     "ndcg@10")
    assert (values, n, why) == ({"a": 0.9, "b": 0.5}, 1, None)
    # disjoint: no values, a sentence; a system without any evaluated query is left out of the intersection
    values, n, why = _shared_offline([_result("a", ["q1"], [0.2]), _result("b", ["q3"], [0.1]), _result("c", [], [])],
                                     "ndcg@10")
    assert (values, n) == ({}, 0) and why == "not ordered: the systems share no evaluated query (a (1), b (1) queries each)"


def test_why_no_interval_rules() -> None:
    assert why_no_interval(Interval(0.5, 0.5, 0.5, 1, "bootstrap")) == "n = 1"
    assert why_no_interval(Interval(0.5, 0.2, 0.8, 4, "bootstrap")) == "n = 4 < 5 for a bootstrap"
    assert why_no_interval(Interval(0.5, 0.2, 0.8, 5, "bootstrap")) is None
    assert why_no_interval(Interval(0.5, 0.2, 0.8, 2, "t")) is None
    assert why_no_interval(Interval(1.0, 0.21, 1.0, 1, "wilson")) is None  # Wilson holds from one trial
    assert why_no_interval(Interval(math.nan, math.nan, math.nan, 0, "wilson")) == "n = 0"


def test_bot_like_clients_are_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 70 searches of client "bot" within 69 s: 61 of them fall in the minute after the first (> 60 a minute)
    queries = [query(f"z{i}", "red shoes", ["d1", "d2"], i, client="bot") for i in range(70)]
    db = build_store(tmp_path / "bots.duckdb", queries=queries)
    human = write_human(tmp_path / "h.jsonl")
    out = tmp_path / "r.json"
    assert ubi(["report", "--db", str(db), "--qrels", str(human), "--json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    # issue 24: the online metrics used to include the bot's searches ("The online metrics here include them"); now
    # the session filter's verdict applies to them too, and the report says how many it left out per system
    assert [w for w in doc["warnings"] if "bots?" in w] == [
        "1 client(s) sent more than 60 searches in a minute (peak 61; 70 searches in all): bots? Left out of the "
        "online metrics, as `ubi process` leaves them out of the judgments"]
    online = doc["online"]["shop/ranker=a"]
    assert online["searches"] == 0 and online["searches_left_out"] == {"total": 70, "by_reason": {"bot": 70}}


# ------------------------------------------------------------------------------------------- propensity

_num = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=32),
                 st.integers(min_value=-5, max_value=5))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_num, _num, _num), min_size=0, max_size=8), st.one_of(st.none(), _num, st.text(max_size=5)))
def test_propensity_plot_never_crashes(rows: list[tuple], level: object) -> None:
    """Any estimate, including one outside its own interval (basic bootstrap on small logs), plots or is skipped."""
    est = {"method": "em", "level": level,
           "ranks": [{"rank": k + 1, "ratio": r, "ci_low": lo, "ci_high": hi} for k, (r, lo, hi) in enumerate(rows)]}
    svg = propensity_svg(est)
    assert svg is None or svg.startswith("<svg")


def test_report_html_with_estimates_outside_their_intervals(tmp_path: Path) -> None:
    # the crash of issue 12: 'yerr' must not contain negative values (ratio 0.30 above its interval 0.10-0.25)
    db = build_store(tmp_path / "ubi.duckdb")
    prop = tmp_path / "p.json"
    prop.write_text(json.dumps({"method": "em", "level": 0.95, "ranks": [
        {"rank": 1, "ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0},
        {"rank": 2, "ratio": 0.30, "ci_low": 0.10, "ci_high": 0.25},
        {"rank": 3, "ratio": 0.05, "ci_low": 0.08, "ci_high": 0.20}]}))
    out = tmp_path / "r.html"
    assert ubi(["report", "--db", str(db), "--qrels", str(write_human(tmp_path / "h.jsonl")), "--propensity", str(prop),
                "--format", "html", "--out", str(out)]) == 0
    assert "estimate outside its interval" in out.read_text()


def test_malformed_propensity_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = build_store(tmp_path / "ubi.duckdb")
    prop = tmp_path / "p.json"
    prop.write_text(json.dumps({"ranks": [{"rank": "one", "ratio": 1.0}]}))
    assert ubi(["report", "--db", str(db), "--qrels", str(write_human(tmp_path / "h.jsonl")), "--propensity",
                str(prop), "--format", "html", "--out", str(tmp_path / "r.html")]) == 2
    assert "ranks[0]: expected an object with an integer rank >= 1" in capsys.readouterr().err

