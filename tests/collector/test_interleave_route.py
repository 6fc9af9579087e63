"""``POST /v1/interleave`` takes what the ingest routes take (issue 25): the body limit, strict JSON (no NaN,
no lone surrogate, no repeated key: 400, where they gave 500 or were taken silently), large bodies off the
event loop."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from ubi_pipeline.collector.app import create_app
from ubi_pipeline.schemas.settings import Settings

JSON = {"content-type": "application/json"}


def _post(client: TestClient, body: bytes) -> tuple[int, dict]:
    r = client.post("/v1/interleave", content=body, headers=JSON)
    return r.status_code, r.json()


def test_strict_json_and_the_body_limit(client: TestClient, tmp_path: Path) -> None:
    good = b'{"query_id": "q1", "rankings": {"a": ["d1", "d2"], "b": ["d2", "d3"]}}'
    status, answer = _post(client, good)
    assert status == 200 and answer["method"] == "team_draft" and len(answer["hits"]) == 2  # the longer ranking
    lone = b'{"query_id": "q\\ud800", "rankings": {"a": ["d1"], "b": ["d2"]}}'  # a lone surrogate escape
    nan = b'{"query_id": "q1", "rankings": {"a": ["d1"], "b": ["d2"]}, "size": NaN}'
    twice = b'{"query_id": "q1", "query_id": "q2", "rankings": {"a": ["d1"], "b": ["d2"]}}'
    for body, says in ((lone, "malformed JSON"), (nan, "malformed JSON"), (twice, "duplicate key 'query_id'")):
        status, answer = _post(client, body)
        assert status == 400 and says in answer["message"], (body, answer)
    status, answer = _post(client, b'{"query_id": "q1", "rankings": {"a": ["d1"]}}')
    assert status == 400 and "exactly two rankings" in answer["message"]
    status, answer = _post(client, b'{"query_id": 5, "rankings": {"a": ["d1"], "b": ["d2"]}}')
    assert status == 400 and answer["message"].startswith("query_id: ")


def test_a_body_over_max_body_bytes_is_413_and_a_large_one_is_served(tmp_path: Path) -> None:
    app = create_app(Settings(db=tmp_path / "ubi.duckdb", max_body_bytes=1_000_000), extensions=False)
    ids = [f"doc-{i:07d}" for i in range(40_000)]  # 2 x 40,000 ids of 11 characters: ~1.1 MB of JSON
    with TestClient(app, base_url="http://localhost") as c:
        big = b'{"query_id": "q1", "rankings": {"a": %s, "b": %s}}' % (
            str(ids).replace("'", '"').encode(), str(ids[::-1]).replace("'", '"').encode())
        assert len(big) > 1_000_000
        status, answer = _post(c, big)
        assert status == 413 and "over the limit of 1000000 bytes" in answer["message"]
        half = b'{"query_id": "q1", "rankings": {"a": %s, "b": %s}}' % (
            str(ids[:20_000]).replace("'", '"').encode(), str(ids[20_000:]).replace("'", '"').encode())
        status, answer = _post(c, half)  # over 64 KiB: parsed and interleaved in a worker thread
        assert status == 200 and len(answer["hits"]) == 20_000
