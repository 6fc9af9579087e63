"""`ubi report` end to end: the hand-checkable world of joint_fixtures, and the real ESCI sample."""

from __future__ import annotations

import copy
import json
import math

import joint_fixtures
import pytest
from joint_fixtures import build_store, ubi, write_human

from tests.conftest import ESCI_JUDGMENTS, shared_path

esci_db = joint_fixtures.esci_db  # the sample store, as a fixture
#: The ESCI reports below check offline metrics, comparisons and orderings, none of which rests on the
#: predicted online metrics; their bootstrap (50 refits per replicate set, about half of a sample report's 3-4 s
#: of CPU in a full run) is skipped here. The point predictions are still made, and test_report_honest.py runs the sample's
#: report with the default replicates.
NO_BOOTSTRAP = ("--predict-replicates", "0")

LOG2_3 = math.log2(3)  # 1.584963
IDCG_RED = 3 + 1 / LOG2_3  # human grades of "red shoes" sorted: 3, 1, 0 -> 3/1 + 1/log2(3) = 3.630930


def _offline(doc, system, source):
    return next(r for r in doc["offline"] if r["system"] == system and r["source"] == source)


def _pq(result, query):
    return next(r for r in result["per_query"] if r["query"] == query)


@pytest.fixture()
def world(tmp_path):
    db = build_store(tmp_path / "ubi.duckdb")
    qrels = write_human(tmp_path / "human.jsonl")
    classes = tmp_path / "classes.toml"
    classes.write_text('[classes]\nfootwear = "shoes|socks"\napparel = "hat"\n')
    out = tmp_path / "r.json"
    code = ubi(["report", "--db", str(db), "--qrels", str(qrels), "--baseline", "shop/ranker=a", "--classes",
                str(classes), "--format", "json", "--out", str(out), "--dashboard", str(tmp_path / "d.ndjson")])
    assert code == 0
    return json.loads(out.read_text()), tmp_path


def test_offline_on_human_labels_by_hand(world):
    doc, _ = world
    assert [s["name"] for s in doc["systems"]] == ["shop/ranker=a", "shop/ranker=b"]
    assert doc["sources"] == ["human", "implicit:ctr", "merged"]
    a, b = _offline(doc, "shop/ranker=a", "human"), _offline(doc, "shop/ranker=b", "human")
    # ranker a, modal rankings: red shoes [d1 d2 d4] (grades 3, 1, -), blue hat [h2 h1] (0, 2)
    #   red: DCG = 3/1 + 1/log2(3) = IDCG -> 1.0; blue: DCG = 2/log2(3) = 1.261860, IDCG = 2 -> 0.630930
    assert _pq(a, "red shoes")["ndcg@10"] == pytest.approx(1.0)
    assert _pq(a, "blue hat")["ndcg@10"] == pytest.approx(1 / LOG2_3)
    assert a["aggregate"]["ndcg@10"]["value"] == pytest.approx((1 + 1 / LOG2_3) / 2)  # 0.815465
    assert a["aggregate"]["ndcg@10"]["n"] == 2
    # MRR a: red 1 (d1 first), blue 1/2 (h1 second) -> 0.75; recall@10 1 for both queries
    assert a["aggregate"]["mrr"]["value"] == pytest.approx(0.75)
    assert a["aggregate"]["recall@10"]["value"] == pytest.approx(1.0)
    # judged@10 a: red 2 of 3 shown judged, blue 2 of 2 -> (2/3 + 1) / 2
    assert a["aggregate"]["judged@10"]["value"] == pytest.approx(5 / 6)
    # ranker b: red [d4 d1 d2] -> DCG = 3/log2(3) + 1/log2(4) = 2.392789, / 3.630930 = 0.659001; blue [h1 h2] -> 1
    assert _pq(b, "red shoes")["ndcg@10"] == pytest.approx((3 / LOG2_3 + 0.5) / IDCG_RED)
    assert b["aggregate"]["ndcg@10"]["value"] == pytest.approx(((3 / LOG2_3 + 0.5) / IDCG_RED + 1) / 2)  # 0.829500
    # MAP b: red (1/2 + 2/3) / 2 = 0.583333, blue 1 -> 0.791667
    assert b["aggregate"]["map"]["value"] == pytest.approx(((1 / 2 + 2 / 3) / 2 + 1) / 2)
    # green bag (only b1: 0) is a labelled negative for both; purple socks has no label at all
    assert [n["query"] for n in a["labelled_negatives"]["per_query"]] == ["green bag"]
    assert a["labelled_negatives"]["per_query"][0]["retrieved"] == 2
    assert (b["unlabelled_queries"], a["unlabelled_queries"]) == (1, 0)
    # classes from the rules file: red shoes -> footwear, blue hat -> apparel
    assert a["per_class"]["footwear"]["ndcg@10"] == {"mean": pytest.approx(1.0), "n": 1}
    assert a["per_class"]["apparel"]["ndcg@10"]["mean"] == pytest.approx(1 / LOG2_3)


def test_offline_on_implicit_and_merged_labels_by_hand(world):
    doc, _ = world
    # implicit:ctr grades: red shoes d1 3, d2 2, d4 1; blue hat h1 1, h2 0 (b2 has no grade)
    # ranker b red [d4 d1 d2]: DCG = 1 + 3/log2(3) + 2/2 = 3.892789; IDCG = 3 + 2/log2(3) + 1/2 = 4.761860
    b = _offline(doc, "shop/ranker=b", "implicit:ctr")
    assert _pq(b, "red shoes")["ndcg@10"] == pytest.approx((1 + 3 / LOG2_3 + 1) / (3 + 2 / LOG2_3 + 0.5))
    assert b["aggregate"]["ndcg@10"]["n"] == 2
    # merged (human > implicit): red shoes d1 3, d2 1 (human wins over 2), d3 0, d4 1 (implicit fills the gap)
    # ranker b red: DCG = 1 + 3/log2(3) + 1/2 = 3.392789; IDCG = 3 + 1/log2(3) + 1/2 = 4.130930 -> 0.821316
    m = _offline(doc, "shop/ranker=b", "merged")
    assert _pq(m, "red shoes")["ndcg@10"] == pytest.approx((1 + 3 / LOG2_3 + 0.5) / (3 + 1 / LOG2_3 + 0.5))
    cov = {(c["system"], c["source"]): c for c in doc["coverage"]}
    # ranker b, implicit:ctr: red 3/3 judged, blue 2/2, green bag [b2] ungraded -> 0, purple socks empty -> 0
    assert cov[("shop/ranker=b", "implicit:ctr")]["judged_at_k"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    assert doc["labels"]["counts"]["implicit:ctr"] == {"pairs": 6, "graded_pairs": 5, "labels": 6, "graded": 5, "queries": 3}


def test_labels_with_provenance_in_every_output(world):
    doc, tmp = world
    labels = doc["labels"]
    # the merged view by hand (test_merge): 8 labelled pairs; human chosen 6 times, implicit:ctr once (d4),
    # b2 has no graded label; d2 (human 1, ctr 2) and h1 (human 2, ctr 1) disagree
    assert labels["merge"] == {
        "precedence": ["human", "reviewed", "implicit"], "pairs": 8, "chosen_by_source": {"human": 6, "implicit:ctr": 1},
        "unresolved": 1, "several_sources": 4, "conflicts": 2, "conflicts_by_sources": {"human vs implicit:ctr": 2},
    }
    assert len(labels["pairs"]) == 8 and labels["pairs_omitted"] is False
    d4 = next(p for p in labels["pairs"] if (p["query"], p["doc_id"]) == ("red shoes", "d4"))
    assert (d4["grade"], d4["source"], d4["conflict"]) == (1, "implicit:ctr", False)
    assert [(lab["source"], lab["model_version"], lab["impressions"]) for lab in d4["labels"]] == [("implicit:ctr", "1", 20)]
    d1 = next(p for p in labels["pairs"] if (p["query"], p["doc_id"]) == ("red shoes", "d1"))
    assert sorted((lab["source"], lab["grade"], lab.get("assessor")) for lab in d1["labels"]) == [
        ("human", 3, "ann"), ("implicit:ctr", 3, None)]
    # the summary in the human formats
    qrels = tmp / "human.jsonl"
    md = tmp / "r.md"
    db = tmp / "ubi.duckdb"
    assert ubi(["report", "--db", str(db), "--qrels", str(qrels), "--format", "md", "--out", str(md)]) == 0
    text = md.read_text()
    # source | pairs | graded pairs | labels (one per assessor) | queries | pairs chosen by the merge
    assert "| human | 6 | 6 | 6 | 3 | 6 |" in text and "| implicit:ctr | 6 | 5 | 6 | 3 | 1 |" in text
    assert "| pairs whose graded labels disagree | 2 |" in text
    assert "| disagree: human vs implicit:ctr | 2 |" in text
    assert "| pairs without a graded label the precedence names (not in the merged view) | 1 |" in text
    txt = tmp / "r.txt"
    assert ubi(["report", "--db", str(db), "--qrels", str(qrels), "--out", str(txt)]) == 0
    assert "human > reviewed > implicit" in txt.read_text() and "disagree: human vs implicit:ctr" in txt.read_text()
    html = tmp / "r.html"
    assert ubi(["report", "--db", str(db), "--qrels", str(qrels), "--format", "html", "--out", str(html)]) == 0
    assert "<td>disagree: human vs implicit:ctr</td><td>2</td>" in html.read_text()
    # --no-labels keeps counts and summary, drops the pairs
    out = tmp / "small.json"
    assert ubi(["report", "--db", str(db), "--qrels", str(qrels), "--json", "--no-labels", "--out", str(out)]) == 0
    small = json.loads(out.read_text())["labels"]
    assert small["pairs"] is None and small["pairs_omitted"] is True and small["merge"] == labels["merge"]


def test_online_agreement_comparison_ordering(world):
    doc, _ = world
    assert doc["online"]["shop/ranker=a"]["metrics"]["ctr@10"]["value"] == pytest.approx(4 / 12)  # test_online
    assert doc["online"]["shop/ranker=b"]["metrics"]["zero_result_rate"]["value"] == pytest.approx(1 / 4)
    ag = doc["agreement"]["implicit:ctr"]
    assert (ag["pairs"], ag["excluded_calibration"]) == (3, 1)
    assert ag["kappa"] == pytest.approx(26 / 29)  # worked out in test_agreement
    c = next(c for c in doc["comparisons"] if c["metric"] == "ndcg@10" and c["source"] == "human")
    # b - a per query: red 0.659001 - 1 = -0.340999, blue 1 - 0.630930 = +0.369070
    assert c["queries"] == 2 and (c["wins"], c["losses"], c["ties"]) == (1, 1, 0)
    assert c["diff"] == pytest.approx(((3 / LOG2_3 + 0.5) / IDCG_RED - 1 + 1 - 1 / LOG2_3) / 2)
    # judged@k is coverage and is not compared; 5 metrics x 3 sources in the Holm family
    assert len(doc["comparisons"]) == 15 and all(c["randomisation_p_holm"] >= c["randomisation_p"]
                                                 for c in doc["comparisons"])
    rr = next(o for o in doc["orderings"] if o["offline_metric"] == "human/ndcg@10"
              and o["online_metric"] == "online/rr_first_click")
    # offline b 0.8295 > a 0.8155; online rr b 0.5 > a 0.366667: same order, 2 systems
    assert rr["offline_order"] == ["shop/ranker=b", "shop/ranker=a"] == rr["online_order"]
    assert rr["kendall"] == pytest.approx(1.0)


def test_dashboard_rows_have_the_sample_shape(world):
    _, tmp = world
    lines = (tmp / "d.ndjson").read_bytes().splitlines()
    sample = shared_path("ubi-samples/sample_search_quality_evaluation_data.ndjson").read_bytes().splitlines()
    sample_keys = set(json.loads(sample[1]))
    rows = [json.loads(x) for x in lines[1::2]]
    actions = [json.loads(x) for x in lines[0::2]]
    # 2 systems x 3 sources x 2 evaluated queries x 6 metrics
    assert len(rows) == 72 and all(set(r) == sample_keys for r in rows)
    assert all(a["index"]["_index"] == "sqe_metrics" for a in actions)
    assert len({a["index"]["_id"] for a in actions}) == 72
    row = next(r for r in rows if r["search_config"] == "shop/ranker=a" and r["query"] == "blue hat"
               and r["metric"] == "ndcg@10" and r["query_set_id"] == "logged:human")
    assert row["value"] == pytest.approx(1 / LOG2_3) and row["application"] == "shop"


def test_mode_each_and_source_selection(tmp_path):
    db = build_store(tmp_path / "ubi.duckdb")
    qrels = write_human(tmp_path / "h.jsonl")
    out = tmp_path / "r.json"
    assert ubi(["report", "--db", str(db), "--qrels", str(qrels), "--mode", "each", "--sources", "implicit:ctr",
                "--metrics", "ndcg@3,mrr", "--json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    a = _offline(doc, "shop/ranker=a", "human")
    # every search on its own: red shoes three times (a1 [d1 d2 d4] -> 1, a2 the same -> 1, a3 [d2 d1 d4]),
    # blue hat once: 4 evaluated searches
    assert a["queries_evaluated"] == 4
    # a3: DCG@3 = 1/1 + 3/log2(3) = 2.892789 over IDCG 3.630930 = 0.796710
    a3 = (1 + 3 / LOG2_3) / IDCG_RED
    assert a["aggregate"]["ndcg@3"]["value"] == pytest.approx((1 + 1 + a3 + 1 / LOG2_3) / 4)
    assert set(a["aggregate"]) == {"ndcg@3", "mrr"}
    assert a["unit"] == "searches"
    assert ubi(["report", "--db", str(db), "--qrels", str(qrels), "--sources", "implicit:nope"]) == 2

    # the tables say what the counts count: searches. a: 4 evaluated (above), a5 "green bag" has only the
    # grade-0 label b1 -> 1 labelled-negative search, 0 unlabelled; b: b1 red + b2 blue evaluated, b3 green bag
    # a labelled negative, b4 "purple socks" has no label -> 1 unlabelled search
    md = tmp_path / "r.md"
    assert ubi(["report", "--db", str(db), "--qrels", str(qrels), "--mode", "each", "--metrics", "ndcg@3",
                "--format", "md", "--out", str(md)]) == 0
    human = md.read_text().split("## Offline metrics: human labels")[1].split("##")[0]
    assert "Mean [CI] over the searches with at least one positive label" in human
    assert "| searches evaluated | 4 | 2 |" in human
    assert "| labelled-negative searches | 1 | 1 |" in human
    assert "| unlabelled searches | 0 | 1 |" in human
    assert "queries evaluated" not in human and "run queries" not in human
    # coverage counts searches too: b's 4 searches, 3 with a human label (b4 has none)
    assert "(3/4 s)" in md.read_text()
    # mode modal keeps the query wording (b: 3 distinct labelled queries of 4)
    assert ubi(["report", "--db", str(db), "--qrels", str(qrels), "--metrics", "ndcg@3", "--format", "md",
                "--out", str(md)]) == 0
    assert "| queries evaluated | 2 | 2 |" in md.read_text() and "(3/4 q)" in md.read_text()


def test_user_errors_exit_2(tmp_path, capsys):
    db = build_store(tmp_path / "ubi.duckdb")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query_id": "q1", "query": "x", "relevant": {"d": -1}}\n')
    assert ubi(["report", "--db", str(db), "--qrels", str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    assert ubi(["report", "--db", str(tmp_path / "none.duckdb"), "--qrels", str(bad)]) == 2
    qrels = write_human(tmp_path / "h.jsonl")
    assert ubi(["report", "--db", str(db), "--qrels", str(qrels), "--baseline", "shop/ranker=zz"]) == 2
    assert "shop/ranker=zz" in capsys.readouterr().err


@pytest.mark.parametrize("baseline", ["Chorus", "esci_ubi_sample"])
def test_esci_baseline_with_no_common_queries(esci_db, tmp_path, baseline):
    # Chorus has no query with an ESCI judgment (0 evaluated), so against either baseline the pair shares no
    # query: before, numpy's reshape of the empty array crashed with exit 1, the gate-failure code
    out, md = tmp_path / "b.json", tmp_path / "b.md"
    assert ubi(["report", "--db", str(esci_db), "--qrels", str(shared_path(ESCI_JUDGMENTS)), *NO_BOOTSTRAP,
                "--baseline", baseline, "--json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    other = "esci_ubi_sample" if baseline == "Chorus" else "Chorus"
    # 5 compared metrics (judged@10 is coverage, not compared) x 1 source (human), each on n = 0
    assert sorted(c["metric"] for c in doc["comparisons"]) == ["map", "mrr", "ndcg@10", "p@10", "recall@10"]
    for c in doc["comparisons"]:
        assert (c["system"], c["baseline"], c["queries"]) == (other, baseline, 0)
        assert (c["wins"], c["losses"], c["ties"]) == (0, 0, 0)
        assert c["diff"] is None and c["randomisation_p_holm"] is None and not c["significant"]
    assert ubi(["report", "--db", str(esci_db), "--qrels", str(shared_path(ESCI_JUDGMENTS)), *NO_BOOTSTRAP,
                "--baseline", baseline, "--format", "md", "--out", str(md)]) == 0
    assert "| human · ndcg@10 | 0 | no common queries | – | – | – | – |" in md.read_text()


def test_esci_online_order_keeps_systems_without_offline_values(esci_db, tmp_path):
    out, md = tmp_path / "o.json", tmp_path / "o.md"
    assert ubi(["report", "--db", str(esci_db), "--qrels", str(shared_path(ESCI_JUDGMENTS)), *NO_BOOTSTRAP,
                "--json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    ctr = {s: doc["online"][s]["metrics"]["ctr@10"] for s in ("Chorus", "esci_ubi_sample")}
    # esci_ubi_sample: 60 click and 1000 impression events in the sample (SQL count by action_name), 5 docs
    # per search -> CTR@10 = 60/1000. Chorus's value (0.126, the online stage's definitions, checked by hand
    # in test_online) matters here only as being the higher one.
    assert ctr["esci_ubi_sample"]["n"] == 1000 and ctr["esci_ubi_sample"]["value"] == pytest.approx(0.06)
    assert ctr["Chorus"]["value"] == pytest.approx(0.126, abs=5e-4) and ctr["Chorus"]["value"] > 0.06
    o = next(o for o in doc["orderings"] if o["online_metric"] == "online/ctr@10")
    # Chorus has no judged query, so no offline nDCG: it is in the online order (first) but not the offline
    # one, and the rank correlation rests on the one system in both, so it is undefined
    assert o["online_order"] == ["Chorus", "esci_ubi_sample"]
    assert o["offline_order"] == ["esci_ubi_sample"]
    assert (o["systems"], o["common"], o["kendall"], o["spearman"]) == (1, ["esci_ubi_sample"], None, None)
    assert ubi(["report", "--db", str(esci_db), "--qrels", str(shared_path(ESCI_JUDGMENTS)), *NO_BOOTSTRAP,
                "--format", "md", "--out", str(md)]) == 0
    text = md.read_text()
    assert "| online/ctr@10 | Chorus > esci_ubi_sample |" in text
    assert "| human/ndcg@10 | online/ctr@10 | 1 (esci_ubi_sample): too few to correlate | – | – |" in text


def test_a_crash_never_exits_1(tmp_path, monkeypatch, capsys):
    # exit 1 means "a gate failed" to CI; Python's exit code for an uncaught exception is 1 as well
    import ubi_pipeline.reports.joint
    from ubi_pipeline.cli import main

    def boom(*_args, **_kwargs):
        raise RuntimeError("boom")

    # `ubi report` imports build_report from ubi_pipeline.reports.joint when it runs (the parser stays light)
    monkeypatch.setattr(ubi_pipeline.reports.joint, "build_report", boom)
    db = build_store(tmp_path / "ubi.duckdb")
    assert main(["report", "--db", str(db), "--qrels", str(write_human(tmp_path / "h.jsonl"))]) == 3
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err and "internal error" in err
    # a bad setting flag is bad input (2), not a crash
    assert main(["report", "--db", str(db), "--window", "-1"]) == 2


def test_square_brackets_in_messages_and_names_survive(tmp_path, capsys):
    from ubi_pipeline.cli import main

    db = build_store(tmp_path / "ubi.duckdb")
    gates = tmp_path / "gates.toml"
    gates.write_text("[minimum]\nndcg = 1\n")
    assert main(["report", "--db", str(db), "--qrels", str(write_human(tmp_path / "h.jsonl")), "--thresholds",
                 str(gates)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "expected systems, [min], [max], [system.\"NAME\".min|max]" in err
    # a system named with brackets keeps them in the terminal tables and in a failed gate's message
    queries = copy.deepcopy(joint_fixtures.QUERIES)
    for q in queries:
        q["query_attributes"]["ranker"] = "[min]" if q["query_attributes"]["ranker"] == "a" else "b"
    db2 = build_store(tmp_path / "b.duckdb", queries)
    out = tmp_path / "r.txt"
    code = main(["report", "--db", str(db2), "--qrels", str(tmp_path / "h.jsonl"), "--out", str(out),
                 "--min", "mrr=0.9"])
    assert code == 1  # mrr: [min] 0.75 (test_offline_on_human_labels_by_hand), b 0.75: both fail
    assert "shop/ranker=[min]" in out.read_text()
    err = " ".join(capsys.readouterr().err.split())
    assert "gate failed: shop/ranker=[min]: human/mrr" in err


def test_esci_sample_end_to_end_with_hand_checks(esci_db, tmp_path):
    out, html, md = tmp_path / "esci.json", tmp_path / "esci.html", tmp_path / "esci.md"
    assert ubi(["report", "--db", str(esci_db), "--qrels", str(shared_path(ESCI_JUDGMENTS)), *NO_BOOTSTRAP,
                "--format", "json", "--out", str(out), "--html", str(html)]) == 0
    doc = json.loads(out.read_text())
    assert {s["name"] for s in doc["systems"]} == {"Chorus", "esci_ubi_sample"}
    esci = _offline(doc, "esci_ubi_sample", "human")
    # 8 of the 119 logged esci_ubi_sample queries have ESCI judgments (the Chorus queries none)
    assert esci["queries_evaluated"] == 8 and esci["unlabelled_queries"] == 111
    assert _offline(doc, "Chorus", "human")["queries_evaluated"] == 0

    # "firestick": shown [g2, g0, g0, g0, g2] (3 identical searches); judged: 22 x grade 3, 19 x 2, 1 x 1, 31 x 0,
    # so 42 positives. DCG@10 = 2/log2(2) + 2/log2(6) = 2 + 0.773706 = 2.773706; ideal = ten grade-3 docs:
    # 3 * sum_{i=1..10} 1/log2(i+1) = 3 * 4.543559 = 13.630677 -> nDCG@10 = 0.203490.
    # recall@10 = 2/42; P@10 = 2/10 (trec_eval divides by k); AP = (1/1 + 2/5) / 42 = 0.033333; RR = 1
    fire = _pq(esci, "firestick")
    ideal = 3 * sum(1 / math.log2(i + 1) for i in range(1, 11))
    assert fire["ndcg@10"] == pytest.approx((2 + 2 / math.log2(6)) / ideal) == pytest.approx(0.203490, abs=1e-6)
    assert (fire["recall@10"], fire["p@10"], fire["mrr"]) == (pytest.approx(2 / 42), pytest.approx(0.2), 1.0)
    assert fire["map"] == pytest.approx(1.4 / 42)
    # "basketball": shown [unjudged, 3, 3, 3, 3]; 53 positives (50 x 3). DCG = 3 (1/log2 3 + 1/log2 4 + 1/log2 5
    # + 1/log2 6) = 5.845376 -> nDCG 0.428840; RR 1/2; AP = (1/2 + 2/3 + 3/4 + 4/5) / 53; judged@10 = 4/5
    ball = _pq(esci, "basketball")
    assert ball["ndcg@10"] == pytest.approx(3 * sum(1 / math.log2(i) for i in (3, 4, 5, 6)) / ideal)
    assert ball["mrr"] == 0.5 and ball["judged@10"] == pytest.approx(0.8)
    assert ball["map"] == pytest.approx((1 / 2 + 2 / 3 + 3 / 4 + 4 / 5) / 53)
    # "gift not included batteries": all five shown docs judged 0 -> every metric 0, judged@10 = 1
    gift = _pq(esci, "gift not included batteries")
    assert gift["ndcg@10"] == 0.0 and gift["judged@10"] == 1.0
    # the aggregate is the plain mean of the 8 per-query values
    assert esci["aggregate"]["ndcg@10"]["value"] == pytest.approx(sum(r["ndcg@10"] for r in esci["per_query"]) / 8)
    assert esci["aggregate"]["ndcg@10"]["value"] == pytest.approx(0.268483, abs=1e-6)
    # events of ubi-demo have no query records: reported, not silently dropped
    assert any(n.startswith("ubi-demo: 429 events") for n in doc["warnings"])
    text = html.read_text()
    assert text.startswith("<!DOCTYPE html>") and "esci_ubi_sample" in text
    assert ubi(["report", "--db", str(esci_db), "--qrels", str(shared_path(ESCI_JUDGMENTS)), *NO_BOOTSTRAP,
                "--format", "md", "--out", str(md)]) == 0
    assert "| ndcg@10 | – | 0.268 [" in md.read_text()


def test_reviewed_labels_class_key_and_propensity(tmp_path):
    import pyarrow as pa

    from ubi_pipeline.store.duckdb_store import Store

    queries = copy.deepcopy(joint_fixtures.QUERIES)
    for q in queries:  # a query class in query_attributes
        q["query_attributes"]["segment"] = "shoes" if "shoes" in q["user_query"].lower() else "other"
    db = build_store(tmp_path / "ubi.duckdb", queries)
    with Store(db) as store:  # a reviewer confirmed d4 as grade 2 (the implicit label said 1)
        store.load_table("human_judgments", pa.table({
            "query_id": [None], "query": ["red shoes"], "doc_id": ["d4"], "grade": pa.array([2], pa.int32()),
            "source": ["reviewed:implicit:ctr"], "assessor": ["rev"], "judged_at": pa.array([None], pa.timestamp("us")),
            "rubric": [None], "origin": ["review.jsonl"],
        }))
    prop = tmp_path / "prop.json"
    prop.write_text(json.dumps({"method": "em", "level": 0.95, "ranks": [{"rank": 1, "ratio": 1.0}]}))
    out = tmp_path / "r.json"
    assert ubi(["report", "--db", str(db), "--qrels", str(write_human(tmp_path / "h.jsonl")), "--class-key",
                "segment", "--propensity", str(prop), "--json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["sources"] == ["human", "reviewed", "implicit:ctr", "merged"]
    assert doc["propensity"]["method"] == "em"
    # merged: d4 takes the reviewed grade 2 over the implicit 1; ranker b red [d4 d1 d2] with merged grades
    # (2, 3, 1): DCG = 2 + 3/log2(3) + 1/2 = 4.392789; ideal (3, 2, 1, 0): 3 + 2/log2(3) + 1/2 = 4.761860
    m = _offline(doc, "shop/ranker=b", "merged")
    assert _pq(m, "red shoes")["ndcg@10"] == pytest.approx((2 + 3 / LOG2_3 + 0.5) / (3 + 2 / LOG2_3 + 0.5))
    a = _offline(doc, "shop/ranker=a", "human")
    assert a["per_class"]["shoes"]["ndcg@10"] == {"mean": pytest.approx(1.0), "n": 1}
    assert a["per_class"]["other"]["ndcg@10"]["n"] == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"ranks": 3}')
    assert ubi(["report", "--db", str(db), "--qrels", str(tmp_path / "h.jsonl"), "--propensity", str(bad)]) == 2
    assert ubi(["report", "--db", str(db), "--qrels", str(tmp_path / "h.jsonl"), "--rating-map", "x:y"]) == 2


def test_store_without_queries_or_labels(tmp_path, capsys):
    empty = build_store(tmp_path / "e.duckdb", [], [], [])
    assert ubi(["report", "--db", str(empty), "--qrels", str(write_human(tmp_path / "h.jsonl"))]) == 2
    assert "no query records" in capsys.readouterr().err
    db = build_store(tmp_path / "n.duckdb", judgments=[])
    assert ubi(["report", "--db", str(db)]) == 2
    assert "no judgments" in capsys.readouterr().err
