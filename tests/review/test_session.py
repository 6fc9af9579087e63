"""The review page's stage and routes on a hand-built store (file free): order, stored rows, undo, guards."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from tests.review.review_store import ORDER, review_store
from ubi_pipeline.processors.labels.catalog import read_docs
from ubi_pipeline.review.app import create_review_app
from ubi_pipeline.review.session import ReviewSession, read_inputs, read_rubric
from ubi_pipeline.schemas.errors import InputFileError, UbiError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.client import reading


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    return review_store(tmp_path / "r.duckdb")


def _open(db: Path, **kw) -> ReviewSession:
    settings = Settings(db=db)
    return ReviewSession.open(db, settings, rubric=read_rubric(None, settings.grade_max), held_out=0, **kw)


def stored(db: Path) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT query, doc_id, grade, source, assessor, rubric, origin, note FROM human_judgments "
                           "ORDER BY assessor, query, doc_id, source").fetchall()
    finally:
        con.close()


def test_inputs_and_order_from_the_store(db: Path):
    with reading(db) as con:
        inputs = read_inputs(con)
    # "Red Shoes" x2 and "red  shoes" x1 are one normalised query: 3 searches (tests/review/review_store.py)
    assert inputs.frequencies == {"red shoes": 3, "blue hat": 2, "green bag": 1}
    assert len(inputs.candidates) == 8 and len(inputs.humans) == 1
    session = _open(db)
    # positions derived next to JUDGMENTS in tests/review/review_store.py
    assert [it.pair for it in session.queue.items] == ORDER
    assert session.queue.items[1].reason.startswith("grades differ by 2 (implicit:pbm 2, ann 0)")


def test_grade_skip_undo_store_exactly_what_was_done(db: Path):
    s = _open(db, assessors_per_pair=2)
    version = s.rubric.version
    assert version.startswith("builtin@") and len(version) == len("builtin@") + 12
    view = s.next("bob")
    assert view["item"]["query"] == "green bag" and view["item"]["evidence"][0]["source"] == "implicit:pbm"
    view = s.grade("bob", "green bag", "g1", 2, "  fits, not exact ")
    assert (view["item"]["query"], view["item"]["doc_id"]) == ORDER[1]
    view = s.skip("bob", *ORDER[1])
    assert (view["item"]["query"], view["item"]["doc_id"]) == ORDER[2]
    view = s.grade("bob", *ORDER[2], 1, None)
    view = s.undo("bob")  # takes back the grade of blue hat / b1: deleted, and served again
    assert (view["item"]["query"], view["item"]["doc_id"]) == ORDER[2] and view["can_undo"]
    view = s.undo("bob")  # takes back the skip: red shoes / r1 is served again
    assert s.next("bob")["item"]["doc_id"] == "r1"
    assert stored(db) == [
        ("red shoes", "r1", 0, "human", "ann", "r0", "sheet.csv", None),
        ("green bag", "g1", 2, "reviewed:implicit:pbm", "bob", version, "review:page", "fits, not exact"),
    ]
    assert s.progress() == [{"assessor": "ann", "graded": 1, "skipped": 0, "left": 5, "pairs": 6},
                            {"assessor": "bob", "graded": 1, "skipped": 0, "left": 5, "pairs": 6}]
    # bob grades r1 differently from ann: a disagreement of 2
    s.grade("bob", "red shoes", "r1", 2, "the red pair")
    [d] = s.disagreements()
    assert (d["query"], d["doc_id"], d["spread"]) == ("red shoes", "r1", 2)
    assert [(g["assessor"], g["grade"], g["note"]) for g in d["grades"]] == [("ann", 0, None), ("bob", 2, "the red pair")]


def test_regrade_then_undo_restores_the_replaced_row(db: Path):
    s = _open(db, blind=True)
    s.grade("cy", "green bag", "g1", 3, "first")
    s.pair("cy", "green bag", "g1")
    s.grade("cy", "green bag", "g1", 1, "second")
    assert [r[2:] for r in stored(db) if r[4] == "cy"] == [(1, "human", "cy", s.rubric.version, "review:page", "second")]
    s.undo("cy")
    assert [r[2:] for r in stored(db) if r[4] == "cy"] == [(3, "human", "cy", s.rubric.version, "review:page", "first")]
    view = s.next("cy")
    assert view["item"]["evidence"] is None and view["item"]["blind"]  # --blind: no evidence shown


def test_held_out_pairs_are_shown_and_stored_blind(db: Path):
    settings = Settings(db=db)
    s = ReviewSession.open(db, settings, rubric=read_rubric(None, 3), held_out=2, seed=3)
    first = s.next("dee")["item"]
    assert first["held_out"] and first["blind"] and first["evidence"] is None
    s.grade("dee", first["query"], first["doc_id"], 1, None)
    assert [r[3] for r in stored(db) if r[4] == "dee"] == ["human"]


def test_errors(db: Path, tmp_path: Path):
    s = _open(db)
    with pytest.raises(UbiError, match=r"grade 4 is outside 0..3 \(UBI_GRADE_MAX\)"):
        s.grade("bob", "green bag", "g1", 4, None)
    with pytest.raises(UbiError, match="assessor name is required"):
        s.next("  ")
    with pytest.raises(UbiError, match="is not in the review queue"):
        s.grade("bob", "green bag", "nope", 1, None)
    with pytest.raises(UbiError, match="bob has nothing to undo"):
        s.undo("bob")
    catalog = tmp_path / "docs.jsonl"
    catalog.write_text('{"doc_id": "g1", "title": "Bag"}\n{"doc_id": "g2", "url": "javascript:alert(1)"}\n')
    with pytest.raises(InputFileError, match=r"docs.jsonl:2: 'url' must be an http\(s\) URL"):
        read_docs(catalog)
    catalog.write_text('{"doc_id": "g1", "title": 3}\n')
    with pytest.raises(InputFileError, match="docs.jsonl:1: .title. must be a string, got int"):
        read_docs(catalog)
    catalog.write_text('{"doc_id": "g1", "title": "<b>Bag</b>", "image": "https://img.example/g1.jpg", "brand": "x"}\n')
    assert read_docs(catalog) == {"g1": {"title": "<b>Bag</b>", "image": "https://img.example/g1.jpg"}}
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("3 perfect\n0 bad\n")
    # sha256 of "3 perfect\n0 bad\n", first 12 hex digits (hashlib, by hand in a shell: sha256sum rubric.txt)
    assert read_rubric(rubric, 3).version == "rubric.txt@" + __import__("hashlib").sha256(b"3 perfect\n0 bad\n").hexdigest()[:12]


def test_routes_and_guards(db: Path):
    s = _open(db)
    app = create_review_app(s, Settings(db=db))
    with TestClient(app, base_url="http://127.0.0.1:8081") as c:
        page = c.get("/review")
        assert page.status_code == 200 and "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert c.get("/review/static/review.js").status_code == 200
        assert c.get("/review/api/next", params={"assessor": "eve"}).json()["item"]["doc_id"] == "g1"
        r = c.post("/review/api/grade", json={"assessor": "eve", "query": "green bag", "doc_id": "g1", "grade": 9})
        assert r.status_code == 400 and "outside 0..3" in r.json()["message"]
        r = c.post("/review/api/grade", json={"assessor": "eve", "query": "green bag", "doc_id": "zz", "grade": 1})
        assert r.status_code == 404
        # DNS rebinding: the page's own routes under another name, or posted to from another origin
        assert c.get("/review/api/progress", headers={"host": "evil.example:8081"}).status_code == 403
        r = c.post("/review/api/undo", json={"assessor": "eve"}, headers={"origin": "http://evil.example"})
        assert r.status_code == 403
    with pytest.raises(UbiError, match="set UBI_REVIEW_TOKEN"):
        create_review_app(s, Settings(db=db), host="0.0.0.0")
    app = create_review_app(s, Settings(db=db, review_token=SecretStr("t0k")), host="0.0.0.0")
    with TestClient(app, base_url="http://10.1.2.3:8081") as c:
        assert c.get("/review").status_code == 200  # the page itself; its data needs the token
        assert c.get("/review/api/config").status_code == 403
        assert c.get("/review/api/config", headers={"x-review-token": "nope"}).status_code == 403
        ok = c.get("/review/api/config", headers={"x-review-token": "t0k"})
        assert ok.status_code == 200 and ok.json()["grade_max"] == 3
        r = c.get("/review/api/config", headers={"x-review-token": "t0k", "origin": "http://evil.example"})
        assert r.status_code == 403


def test_a_second_grade_of_a_pair_keeps_the_first_ones_source(db: Path):
    # fay grades g1 blind (source human), then, on a page showing evidence, grades it again from the
    # disagreements view: her row is replaced, not joined by a reviewed:implicit:pbm one
    blind = _open(db, blind=True)
    blind.grade("fay", "green bag", "g1", 3, None)
    shown = _open(db)
    shown.grade("fay", "green bag", "g1", 1, "changed my mind")
    assert [r[2:5] for r in stored(db) if r[4] == "fay"] == [(1, "human", "fay")]
