"""`ubi report`'s predicted online metrics, the joint view and the Interleaving section in every format.

The store is the joint_fixtures world (shop/ranker=a: 5 searches, shop/ranker=b: 4) plus one interleaved search
of "red shoes" (application shop, no ranker attribute, so it is the logged system ``shop``): team draft of
rankers a (reference) and b, hits d1 (a) d4 (b) d2 (a), one click on d4, so b wins the one search: win rate 1.
The run file bm25.trec (q1 = "red shoes": d3 d1 d2, q2 = "blue hat": h1 h2) never served.
"""

from __future__ import annotations

import json

import pytest
from joint_fixtures import EVENTS, QUERIES, build_store, event, query, ubi, write_human

BM25 = "q1 Q0 d1 1 2.0 bm25\nq1 Q0 d3 2 3.0 bm25\nq1 Q0 d2 3 1.0 bm25\nq2 Q0 h2 1 1.0 bm25\nq2 Q0 h1 2 2.0 bm25\n"
BLOCK = {"interleaving": {"method": "team_draft", "rankers": ["a", "b"], "teams": {"d1": "a", "d4": "b", "d2": "a"}}}


@pytest.fixture()
def argv(tmp_path):
    interleaved = query("i1", "red shoes", ["d1", "d4", "d2"], 900, ranker=None, client="c7", query_attributes=BLOCK)
    db = build_store(tmp_path / "ubi.duckdb", [*QUERIES, interleaved],
                     [*EVENTS, event("click", "i1", "d4", 1, 905, "S7", client="c7")])
    (tmp_path / "bm25.trec").write_text(BM25)
    return ["report", "--db", str(db), "--qrels", str(write_human(tmp_path / "human.jsonl")),
            "--run", str(tmp_path / "bm25.trec"), "--baseline", "shop/ranker=a", "--predict-replicates", "3"]


def _pair(doc, reference, challenger):
    return next(p for p in doc["joint"]["pairs"] if (p["reference"], p["challenger"]) == (reference, challenger))


def _line(pair, evidence):
    return next(ln for ln in pair["lines"] if ln["evidence"] == evidence)


def test_json_holds_the_prediction_and_the_joint_view(argv, tmp_path) -> None:
    out = tmp_path / "r.json"
    assert ubi([*argv, "--json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    pred = doc["predicted"]
    assert pred["replicates"] == 3 and set(pred["systems"]) == {"bm25"}
    bm25 = pred["systems"]["bm25"]
    # bm25 ranks 2 queries the log has ("red shoes", "blue hat")
    assert bm25["covered_queries"] == 2 and bm25["bootstrap"]["replicates"] == 3
    assert set(bm25["methods"]) == {"dm", "ips", "snips", "dr"} and "ctr@10" in bm25["methods"]["dm"]
    assert set(pred["observed"]) == {"shop", "shop/ranker=a", "shop/ranker=b"}

    # pairs: the baseline against each other system first, then the rest; the interleaved system "shop" is a
    # mix of two rankers and gets none
    pairs = [(p["reference"], p["challenger"]) for p in doc["joint"]["pairs"]]
    assert pairs == [("shop/ranker=a", "shop/ranker=b"), ("shop/ranker=a", "bm25"), ("shop/ranker=b", "bm25")]
    ab = _pair(doc, "shop/ranker=a", "shop/ranker=b")
    assert [ln["evidence"] for ln in ab["lines"]] == ["human offline", "implicit offline", "predicted online",
                                                      "observed online (A/B)", "interleaving"]
    # the human line is the comparison section's b − a on human/ndcg@10 (the same paired bootstrap)
    comp = next(c for c in doc["comparisons"] if c["system"] == "shop/ranker=b" and c["source"] == "human"
                and c["metric"] == "ndcg@10")
    human = _line(ab, "human offline")
    assert human["difference"] == pytest.approx(comp["diff"]) and human["n"] == comp["queries"]
    # observed: both served, 5 + 4 searches
    assert _line(ab, "observed online (A/B)")["n"] == 9
    # interleaving: b won the one search with a winner: win rate 1, so +1/2
    il = _line(ab, "interleaving")
    assert (il["difference"], il["n"], il["sign"]) == (0.5, 1, 1)
    # a run never served: no A/B line, said why
    a_bm25 = _line(_pair(doc, "shop/ranker=a", "bm25"), "observed online (A/B)")
    assert a_bm25["difference"] is None and a_bm25["missing"] == "bm25 never served (no log)"
    pd = doc["joint"]["predicted"]
    assert pd["method"] == "dr" and pd["replicates"] == 3 and set(pd["values"]) == {"shop/ranker=a", "shop/ranker=b",
                                                                                      "bm25"}
    predicted = _line(ab, "predicted online")
    assert predicted["difference"] == pytest.approx(pd["values"]["shop/ranker=b"] - pd["values"]["shop/ranker=a"])
    assert ab["agree_in_sign"] in (True, False) and ab["verdict"]


def test_text_markdown_and_html_show_every_new_section(argv, tmp_path) -> None:
    md, html, text = tmp_path / "r.md", tmp_path / "r.html", tmp_path / "r.txt"
    assert ubi([*argv, "--format", "md", "--out", str(md), "--html", str(html)]) == 0
    assert ubi([*argv, "--out", str(text)]) == 0
    m, h, t = md.read_text(), html.read_text(), text.read_text()
    assert "## Predicted online metrics (run systems, never served)" in m and "3 bootstrap replicates" in m
    assert "## Joint view: each pair of systems" in m and "### bm25 − shop/ranker=a" in m
    assert "## Interleaving" in m
    assert "<h2>Interleaving (team draft)</h2>" in h and "b-vs-a" in h
    assert "<h2>Predicted online metrics (run systems, never served)</h2>" in h
    # one forest plot per pair: three pairs, each its own inline SVG under the joint view
    joint = h[h.index("<h2>Joint view"):h.index("<h2>Agreement")]
    assert joint.count("<svg") == 3 and "shop/ranker=b − shop/ranker=a" in joint
    assert "Joint view: every kind of evidence" in t and "Predicted online metrics of the run systems" in t


def test_predict_replicates_must_not_be_negative(argv, capsys) -> None:
    assert ubi([*argv, "--predict-replicates", "-1"]) == 2
    assert "--predict-replicates -1: expected 0 or more" in capsys.readouterr().err


def test_a_store_without_logs_says_why_the_run_is_not_predicted(tmp_path) -> None:
    db = build_store(tmp_path / "ubi.duckdb", [], [])  # judgments only: no UBI tables, no sessions
    (tmp_path / "bm25.trec").write_text(BM25)
    out = tmp_path / "r.json"
    assert ubi(["report", "--db", str(db), "--qrels", str(write_human(tmp_path / "h.jsonl")), "--run",
                str(tmp_path / "bm25.trec"), "--json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["predicted"]["systems"] == {} and doc["joint"]["pairs"] == []
    assert "run systems: the store holds no logged sessions to predict their online metrics from" in doc["notes"]


def test_default_replicates_are_the_50_a_small_log_affords(argv, tmp_path) -> None:
    out = tmp_path / "r.json"
    default = [a for i, a in enumerate(argv) if a != "--predict-replicates" and argv[i - 1] != "--predict-replicates"]
    assert ubi([*default, "--json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    # one fit on this log takes milliseconds, so the CPU budget (60 s) allows the default 50
    assert doc["predicted"]["replicates"] == 50 and doc["predicted"]["systems"]["bm25"]["bootstrap"]["replicates"] == 50
    assert doc["config"]["predict_replicates"] == 50
    assert not any(n.startswith("predictions:") for n in doc["notes"])
