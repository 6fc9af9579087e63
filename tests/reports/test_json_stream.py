"""The streamed JSON report (ubi_pipeline.reports.render.json_out.write_json) is byte for byte the whole document dumped at once.

The reference in every test is what `ubi report --format json` wrote before the render was streamed:
``orjson.dumps(report_dict(report), option=OPT_INDENT_2 | OPT_SORT_KEYS) + b"\\n"``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import uuid
from pathlib import Path

import orjson
import pytest
from joint_fixtures import build_store, hand_world_report, write_human

from ubi_pipeline.processors.labels.implicit import process
from ubi_pipeline.processors.labels.merge import LabelSet, labels_from_store
from ubi_pipeline.processors.simulation.bulk_log import write_store
from ubi_pipeline.reports.joint import ReportConfig, build_report
from ubi_pipeline.reports.render import json_out
from ubi_pipeline.reports.render.json_out import render_json, report_dict, write_json
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.client import open_reader

#: Generated events (ubi_pipeline.processors.simulation.bulk_log, one search per 12 events): enough searches that PBM grades
#: a few thousand pairs whose parameters share their run-wide part, the shape of the 20M report's label pairs.
EVENTS = 60_000


def verdict_first(doc: dict) -> bytes:
    """The encoding the report promises (issue 24: the verdict first in every format): ``verdict``, then every
    other key sorted, indented by two; built here from two plain orjson dumps, not by the code under test."""
    options = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
    head = orjson.dumps({"verdict": doc["verdict"]}, option=options)
    rest = orjson.dumps({k: v for k, v in doc.items() if k != "verdict"}, option=options)
    return head[:-2] + b",\n" + rest[2:] + b"\n"


def whole(report, *, label_pairs: bool = True) -> bytes:
    """The document as the render made it before it was streamed."""
    return verdict_first(report_dict(report, label_pairs=label_pairs))


def streamed(report, **options) -> bytes:
    buf = io.BytesIO()
    n = write_json(report, buf, **options)
    assert n == len(buf.getvalue())  # the count returned is what was written
    return buf.getvalue()


@pytest.fixture(scope="module")
def hand_report(tmp_path_factory):
    """The hand-checkable world of joint_fixtures: human and implicit:ctr labels, two rankers."""
    return hand_world_report(tmp_path_factory.mktemp("hand"),
                             ReportConfig(baseline="shop/ranker=a", n_boot=200, n_perm=200))


@pytest.fixture(scope="module")
def pbm_report(tmp_path_factory):
    """A generated log with PBM judgments stored by `ubi process`: every label carries the merged parameters."""
    db = tmp_path_factory.mktemp("pbm") / "ubi.duckdb"
    write_store(db, EVENTS, seed=5)
    process(db, "pbm", Settings(db=db))
    con = open_reader(db)
    try:
        labels = LabelSet().add(labels_from_store(con))
        return build_report(con, labels, ReportConfig(n_boot=50, n_perm=50), inputs={"db": str(db)})
    finally:
        con.close()


def test_the_hand_report_streams_to_the_same_bytes(hand_report):
    ref = whole(hand_report)
    assert len(hand_report.label_pairs) > 3
    for batch in (1, 2, 3, len(hand_report.label_pairs), 10_000):  # one pair a batch .. all in one
        assert streamed(hand_report, batch=batch) == ref
    assert render_json(hand_report) == ref
    assert streamed(hand_report, label_pairs=False) == whole(hand_report, label_pairs=False)
    assert json.loads(ref)["labels"]["pairs_omitted"] is False


def test_pbm_labels_with_shared_parameters_stream_to_the_same_bytes(pbm_report):
    pairs = pbm_report.label_pairs
    assert len(pairs) > 1_000  # 5,000 searches of bulk_log: a few thousand (query, doc) pairs
    params = [lab.parameters for p in pairs for lab in p.labels if lab.parameters]
    assert len(params) == len(pairs)  # every pair has its one PBM label, with parameters
    # the run-wide part is shared between the labels' dicts (ubi_pipeline.store.judgment_params): what the memo relies on
    shared = [k for k, v in params[0].items() if isinstance(v, dict | list) and params[-1].get(k) is v]
    assert shared
    ref = whole(pbm_report)
    # 1,000 a batch: several batches and a partial last one; the default; one pair a batch for the first 7
    assert streamed(pbm_report, batch=1_000) == ref
    assert streamed(pbm_report) == ref
    first = dataclasses.replace(pbm_report, label_pairs=pairs[:7])
    assert streamed(first, batch=1) == whole(first)
    doc = json.loads(ref)
    assert len(doc["labels"]["pairs"]) == len(pairs)
    assert doc["labels"]["pairs"][-1]["labels"][0]["parameters"] == json.loads(
        orjson.dumps(json_out._clean(pairs[-1].labels[0].parameters)))


def test_no_label_pairs_is_an_empty_array(hand_report):
    empty = dataclasses.replace(hand_report, label_pairs=[])
    ref = whole(empty)
    assert b'"pairs": []' in ref
    assert streamed(empty) == ref


def test_a_report_string_equal_to_the_placeholder_picks_another(hand_report, monkeypatch):
    """The placeholder is a random name; should a string of the report equal it, another is drawn."""
    taken = dataclasses.replace(hand_report, notes=[*hand_report.notes, f"ubi-label-pairs-{uuid.UUID(int=0).hex}"])
    drawn = iter([uuid.UUID(int=0), uuid.UUID(int=1)])
    monkeypatch.setattr(json_out.uuid, "uuid4", lambda: next(drawn))
    assert streamed(taken) == whole(taken)
    assert next(drawn, None) is None  # both were drawn: the first one was refused


def test_the_memo_cleans_a_shared_container_once_and_leaves_values_alike(monkeypatch):
    calls = []
    inner = {"a": float("nan"), "b": [1.5, float("inf")]}
    original = json_out._clean_one

    def counting(value, memo):
        calls.append(id(value))
        return original(value, memo)

    rows = [{"shared": inner, "own": i} for i in range(4)]
    memo: dict = {}
    monkeypatch.setattr(json_out, "_clean_one", counting)
    cleaned = [json_out._clean(r, memo) for r in rows]
    assert cleaned == [{"shared": {"a": None, "b": [1.5, None]}, "own": i} for i in range(4)]
    assert calls.count(id(inner)) == 1  # cleaned for the first row, reused for the other three
    assert cleaned[0]["shared"] is cleaned[3]["shared"]


def test_the_cli_writes_the_streamed_report(tmp_path: Path):
    from joint_fixtures import ubi

    db = build_store(tmp_path / "ubi.duckdb")
    out = tmp_path / "r.json"
    assert ubi(["report", "--db", str(db), "--qrels", str(write_human(tmp_path / "h.jsonl")), "--format", "json",
                "--out", str(out)]) == 0
    doc = json.loads(out.read_bytes())
    assert doc["labels"]["pairs"] and doc["labels"]["pairs_omitted"] is False
    # what the file holds is the document re-encoded: the verdict first, then the keys sorted (its created_at is
    # the run's own)
    assert out.read_bytes() == verdict_first(doc) and next(iter(doc)) == "verdict"
