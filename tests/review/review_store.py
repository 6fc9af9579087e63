"""A hand-built store for the review page's tests: searches, candidate judgments of two sources, one human grade."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pyarrow as pa

from tests.processors.ubi_records import build_store, make_query
from ubi_pipeline.store.duckdb_store import Store
from ubi_pipeline.store.rows import HUMAN_JUDGMENT_SCHEMA

T = datetime(2025, 1, 1)

#: searches per query as typed: "Red Shoes" and "red  shoes" normalise to one query seen 3 times
SEARCHES = {"Red Shoes": 2, "red  shoes": 1, "blue hat": 2, "green bag": 1}


def judgment(query: str, doc: str, source: str, grade: int | None, width: float | None, *, score: float = 0.5,
             support: int = 20) -> dict:
    lo = None if width is None else 0.3
    if source.startswith("model:"):  # as `ubi judge` and `judgments import --source model:*` store them: no clicks
        return {"query": query, "doc_id": doc, "source": source, "score": None if grade is None else float(grade),
                "ci_low": None, "ci_high": None, "impressions": None, "clicks": None, "sessions": None,
                "grade": grade, "created_at": T}
    return {"query": query, "doc_id": doc, "source": source, "score": score, "ci_low": lo,
            "ci_high": None if width is None else round(lo + width, 6), "impressions": support, "clicks": support // 4,
            "sessions": support, "grade": grade, "created_at": T}


#: (query, doc): why it is where it is (held-out sample off)
JUDGMENTS = [
    judgment("green bag", "g1", "implicit:pbm", 3, 0.1), judgment("green bag", "g1", "model:llm", 0, None),  # 1st: range 3
    judgment("red shoes", "r1", "implicit:pbm", 2, 0.2),  # 2nd: pbm 2, yet ann's stored grade is 0: range 2
    judgment("blue hat", "b1", "implicit:pbm", 1, 0.3), judgment("blue hat", "b1", "model:llm", 2, None),  # 3rd: range 1
    judgment("red shoes", "r2", "implicit:pbm", 1, 0.45),  # 4th: range 0, band 4, shoes seen 3 times
    judgment("blue hat", "b2", "implicit:pbm", 1, 0.42),  # 5th: range 0, band 4, hat seen 2 times
    judgment("green bag", "g2", "implicit:pbm", None, None),  # 6th: no interval
]
ORDER = [("green bag", "g1"), ("red shoes", "r1"), ("blue hat", "b1"), ("red shoes", "r2"), ("blue hat", "b2"),
         ("green bag", "g2")]


def human(query: str, doc: str, grade: int, assessor: str, source: str = "human", note: str | None = None) -> dict:
    return {"query_id": query, "query": query, "doc_id": doc, "grade": grade, "source": source, "assessor": assessor,
            "judged_at": T, "rubric": "r0", "origin": "sheet.csv", "note": note}


def review_store(path: Path) -> Path:
    queries = [make_query(f"q{i}-{j}", text, ["x"], at=float(i)) for i, (text, n) in enumerate(SEARCHES.items())
               for j in range(n)]
    build_store(path, queries, [])
    with Store(path) as store:
        store.load_table("judgments", pa.Table.from_pylist(JUDGMENTS))
        store.load_table("human_judgments", pa.Table.from_pylist([human("red shoes", "r1", 0, "ann")],
                                                                 schema=HUMAN_JUDGMENT_SCHEMA))
    return path
