"""`ubi report --run FILE[=NAME]`: run files as extra systems beside the logged ones (joint_fixtures world).

The store holds the two logged rankers of joint_fixtures (shop/ranker=a, shop/ranker=b), its human qrels
(q1 "red shoes" {d1: 3, d2: 1, d3: 0}, q2 "blue hat" {h1: 2, h2: 0}, q3 "green bag" {b1: 0}) and the
implicit:ctr grades (red shoes d1 3, d2 2, d4 1; blue hat h1 1, h2 0). Two tiny run files:

bm25.trec (TREC, tag ``bm25``; lines deliberately out of score order, ranks wrong, to show trec_eval's order)
  q1: d1 score 2, d3 score 3, d2 score 1   -> ranked d3 d1 d2 (by score, rank column ignored)
  q2: h2 score 1, h1 score 2                -> ranked h1 h2
  query ids q1 / q2 are query_ids of the qrels, so they stand for "red shoes" / "blue hat".

texts.jsonl (JSONL rankings, no tag; named ``mine`` with FILE=NAME)
  "Red  Shoes": [d2, d4]   -> not a qrels query_id, so the id is the text: normalised "red shoes"
  "blue hat":   [h2]
  "socks":      [x1]       -> no label anywhere: unlabelled (and named in a note)
"""

from __future__ import annotations

import json
import math
import re

import pytest
from joint_fixtures import build_store, ubi, write_human

LOG2_3 = math.log2(3)  # 1.584963
IDCG_RED = 3 + 1 / LOG2_3  # human grades of red shoes sorted 3, 1, 0: 3/1 + 1/log2(3) = 3.630930

BM25 = "q1 Q0 d1 1 2.0 bm25\nq1 Q0 d3 2 3.0 bm25\nq1 Q0 d2 3 1.0 bm25\nq2 Q0 h2 1 1.0 bm25\nq2 Q0 h1 2 2.0 bm25\n"
TEXTS = ('{"query_id": "Red  Shoes", "doc_ids": ["d2", "d4"]}\n{"query_id": "blue hat", "doc_ids": ["h2"]}\n'
         '{"query_id": "socks", "doc_ids": ["x1"]}\n')


def _offline(doc, system, source):
    return next(r for r in doc["offline"] if r["system"] == system and r["source"] == source)


def _pq(result, query):
    return next(r for r in result["per_query"] if r["query"] == query)


@pytest.fixture()
def files(tmp_path):
    db = build_store(tmp_path / "ubi.duckdb")
    qrels = write_human(tmp_path / "human.jsonl")
    (tmp_path / "bm25.trec").write_text(BM25)
    (tmp_path / "texts.jsonl").write_text(TEXTS)
    return tmp_path, ["report", "--db", str(db), "--qrels", str(qrels), "--run", str(tmp_path / "bm25.trec"),
                      "--run", f"{tmp_path / 'texts.jsonl'}=mine"]


def test_run_files_are_systems_evaluated_by_hand(files):
    tmp, argv = files
    out = tmp / "r.json"
    assert ubi([*argv, "--json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    # logged systems first (sorted), then the runs in the order given; bm25 named by its tag
    assert [(s["name"], s["kind"]) for s in doc["systems"]] == [
        ("shop/ranker=a", "logs"), ("shop/ranker=b", "logs"), ("bm25", "run"), ("mine", "run")]
    assert doc["systems"][2]["searches"] is None and doc["systems"][2]["queries"] == 2

    bm25, mine = _offline(doc, "bm25", "human"), _offline(doc, "mine", "human")
    # bm25 q1 -> red shoes, ranked d3 d1 d2 (grades 0, 3, 1): DCG = 3/log2(3) + 1/log2(4) = 2.392789,
    # / IDCG 3.630930 = 0.659002; recall@10 = 2/2; RR = 1/2. q2 -> blue hat [h1 h2]: nDCG 1, RR 1
    red = _pq(bm25, "red shoes")
    assert red["query_id"] == "q1"
    assert red["ndcg@10"] == pytest.approx((3 / LOG2_3 + 0.5) / IDCG_RED) == pytest.approx(0.659002, abs=1e-6)
    assert (red["recall@10"], red["mrr"]) == (pytest.approx(1.0), pytest.approx(0.5))
    assert _pq(bm25, "blue hat")["ndcg@10"] == pytest.approx(1.0)
    assert bm25["aggregate"]["ndcg@10"]["value"] == pytest.approx(((3 / LOG2_3 + 0.5) / IDCG_RED + 1) / 2)  # 0.829501
    assert bm25["aggregate"]["ndcg@10"]["n"] == 2 and bm25["unlabelled_queries"] == 0
    # mine "Red  Shoes" -> red shoes [d2 d4]: DCG = 1/1 = 1, / 3.630930 = 0.275412; recall 1 of 2 positives
    # "blue hat" [h2] (grade 0): nDCG 0, recall 0. Means: nDCG 0.137706, recall 0.25; "socks" unlabelled
    assert _pq(mine, "red shoes")["query_id"] == "Red  Shoes"
    assert _pq(mine, "red shoes")["ndcg@10"] == pytest.approx(1 / IDCG_RED) == pytest.approx(0.275412, abs=1e-6)
    assert mine["aggregate"]["ndcg@10"]["value"] == pytest.approx(1 / IDCG_RED / 2)
    assert mine["aggregate"]["recall@10"]["value"] == pytest.approx(0.25)
    # judged@10 over evaluated queries: red 1 of 2 shown (d4 unjudged), blue 1 of 1 -> 0.75
    assert mine["aggregate"]["judged@10"]["value"] == pytest.approx(0.75)
    assert (mine["run_queries"], mine["unlabelled_queries"]) == (3, 1)
    # coverage over every run query: (1/2 + 1 + 0 for socks) / 3 = 0.5, 2 of 3 queries labelled
    cov = next(c for c in doc["coverage"] if c["system"] == "mine" and c["source"] == "human")
    assert (cov["judged_at_k"], cov["queries_labelled"], cov["queries"]) == (pytest.approx(0.5), 2, 3)

    # the implicit source is joined the same way: q1 -> red shoes; ctr grades d1 3, d2 2, d4 1 (d3 none)
    # bm25 [d3 d1 d2]: DCG = 3/log2(3) + 2/log2(4) = 2.892789; IDCG = 3 + 2/log2(3) + 1/2 = 4.761860 -> 0.607488
    ctr = _offline(doc, "bm25", "implicit:ctr")
    assert _pq(ctr, "red shoes")["ndcg@10"] == pytest.approx((3 / LOG2_3 + 1) / (3 + 2 / LOG2_3 + 0.5))
    assert _offline(doc, "bm25", "merged")["queries_evaluated"] == 2

    # no online metrics: absent (null), never zero. The runs have the offline metric, so they are in the
    # offline orders; the online orders and the rank correlation hold the logged systems only
    assert doc["online"]["bm25"] is None and doc["online"]["mine"] is None
    assert doc["online"]["shop/ranker=a"]["searches"] == 5
    rr = next(o for o in doc["orderings"] if o["offline_metric"] == "human/ndcg@10"
              and o["online_metric"] == "online/rr_first_click")
    # human nDCG@10: bm25 0.829501 = b 0.829501 (the same two per-query values; the tie goes by name),
    # a 0.815465, mine 0.137706
    assert rr["offline_order"] == ["bm25", "shop/ranker=b", "shop/ranker=a", "mine"]
    assert rr["online_order"] == ["shop/ranker=b", "shop/ranker=a"]  # rr 0.5 > 0.366667
    assert rr["common"] == ["shop/ranker=a", "shop/ranker=b"] and rr["systems"] == 2 and rr["kendall"] == 1.0
    assert all(set(o["online_order"]) == {"shop/ranker=a", "shop/ranker=b"} for o in doc["orderings"])
    assert any("run mine" in n and "1 of 3 query ids match no judged query" in n for n in doc["notes"])


def test_run_as_baseline_with_gates_and_text_output(files, capsys):
    tmp, argv = files
    out = tmp / "r.json"
    code = ubi([*argv, "--baseline", "bm25", "--min", "ndcg@10=0.5", "--min", "online/ctr@10=0.01",
                "--json", "--out", str(out)])
    doc = json.loads(out.read_text())
    # human nDCG@10 per query (test above and test_report_command): ranker a red 1.0, blue 1/log2(3) = 0.630930;
    # bm25 red 0.659002, blue 1.0. a − bm25: red +0.340998, blue −0.369070 -> mean −0.014036, 1 win 1 loss
    c = next(c for c in doc["comparisons"] if c["system"] == "shop/ranker=a" and c["source"] == "human"
             and c["metric"] == "ndcg@10")
    assert c["baseline"] == "bm25" and c["queries"] == 2
    bm25_red = (3 / LOG2_3 + 0.5) / IDCG_RED
    assert c["diff"] == pytest.approx(((1 - bm25_red) + (1 / LOG2_3 - 1)) / 2)
    assert (c["wins"], c["losses"], c["ties"]) == (1, 1, 0)
    # mine − bm25: red 0.275412 − 0.659002, blue 0 − 1 -> mean −0.691795, 2 losses (socks has no label)
    m = next(c for c in doc["comparisons"] if c["system"] == "mine" and c["source"] == "human"
             and c["metric"] == "ndcg@10")
    assert m["diff"] == pytest.approx(((1 / IDCG_RED - bm25_red) + (0 - 1)) / 2)
    assert (m["wins"], m["losses"], m["queries"]) == (0, 2, 2)
    assert not any(c["system"] == "bm25" for c in doc["comparisons"])
    # gates: nDCG@10 >= 0.5 holds for a (0.8155), b (0.8295), bm25 (0.8295), fails for mine (0.1377);
    # the online gate names no system, so it applies to the logged ones only (a run has no log)
    assert code == 1
    failed = doc["gates"]["failed"]
    assert len(failed) == 1 and failed[0].startswith("mine: human/ndcg@10")
    assert {(g["system"], g["metric"]) for g in doc["gates"]["results"] if g["metric"].startswith("online/")} == {
        ("shop/ranker=a", "online/ctr@10"), ("shop/ranker=b", "online/ctr@10")}
    # an online gate that names a run fails and says why
    gates = tmp / "gates.toml"
    gates.write_text('[system."bm25".min]\n"online/ctr@10" = 0.01\n')
    assert ubi([*argv, "--thresholds", str(gates), "--json", "--out", str(out)]) == 1
    (g,) = json.loads(out.read_text())["gates"]["results"]
    assert g["system"] == "bm25" and not g["passed"] and "no online metrics (no log)" in g["reason"]

    capsys.readouterr()
    assert ubi([*argv, "--baseline", "bm25", "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "## Systems in the logs and run files" in md
    assert "| from | logs | logs | run file " in md
    assert re.search(r"\| searches \| 5 \| 4 \| no log \| no log \|", md)  # online: 5 and 4 logged searches
    assert "## Against the baseline bm25" in md and "### mine − bm25" in md
    assert "| not in the online orders (no log) | bm25, mine |" in md
    # ordered on the queries all four were evaluated on: red shoes and blue hat (socks has no label, green bag
    # is a labelled negative), the same two the comparisons above pair
    assert "| human/ndcg@10 | bm25 > shop/ranker=b > shop/ranker=a > mine (on the 2 queries they share) |" in md


def test_bad_run_files_name_file_and_line(files, capsys):
    tmp, argv = files
    base = argv[:5]  # report --db DB --qrels QRELS
    bad = tmp / "bad.trec"
    bad.write_text("q1 Q0 d1 1 2.0 bm25\nq1 Q0 d2 2 bm25\n")  # line 2: 5 fields, the score is missing
    assert ubi([*base, "--run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2:" in err and "expected 6 whitespace-separated fields" in err
    # q1 is the qrels id of "red shoes", and line 2 names the same query by its text: one query, two rankings
    twice = tmp / "twice.trec"
    twice.write_text("q1 Q0 d1 1 2.0 x\nred_shoes Q0 d1 1 2.0 x\n")
    twice_jsonl = tmp / "twice.jsonl"
    twice_jsonl.write_text('{"query_id": "q1", "doc_ids": ["d1"]}\n{"query_id": "RED SHOES", "doc_ids": ["d2"]}\n')
    assert ubi([*base, "--run", str(twice)]) == 0  # red_shoes is another query (unlabelled), not an error
    capsys.readouterr()
    assert ubi([*base, "--run", str(twice_jsonl)]) == 2
    err = capsys.readouterr().err
    assert f"{twice_jsonl}:2:" in err and "'q1' (line 1) and 'RED SHOES' both stand for the query 'red shoes'" in err
    # a name already taken by a logged system, and an unknown baseline, are refused too
    assert ubi([*base, "--run", f"{tmp / 'bm25.trec'}=shop/ranker=a"]) == 2
    assert "already a system of the logs" in capsys.readouterr().err
    assert ubi([*base, "--run", str(tmp / "bm25.trec"), "--run", str(tmp / "bm25.trec")]) == 2
    assert "already used by" in capsys.readouterr().err
