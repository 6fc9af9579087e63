"""Model judgments as a source: `ubi judge` against a chat-completions server, `judgments import --source model:x`.

No model runs here: the server is a small ``http.server`` app on loopback, started by the test, that speaks the
OpenAI chat-completions protocol (POST /v1/chat/completions -> {"choices": [{"message": {"content": ...}}]})
and returns canned answers per document: well-formed JSON, a fenced JSON block, a malformed answer, a 429
before the answer, and an answer slower than the client's timeout. Expected grades are the canned ones; the
agreement figures are worked by hand below.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.reports.joint_fixtures import build_store, write_human
from ubi_pipeline.cli import main
from ubi_pipeline.processors.labels.model_judge import (
    ClientSettings,
    JudgeError,
    ask,
    build_messages,
    parse_grade,
    rubric_digest,
    source_for,
)

#: canned answers by document id: (status codes before the answer, seconds to wait, the answer's content)
CANNED: dict[str, tuple[list[int], float, str]] = {
    "h1": ([429], 0.0, '{"grade": 1, "reason": "a hat, wrong colour"}'),  # 429 first, then the answer
    "h2": ([], 0.0, '{"grade": 0, "reason": "not a hat"}'),
    "b2": ([], 3.0, '{"grade": 2, "reason": "too late"}'),  # slower than the client's timeout, every time
    "d1": ([500], 0.0, '{"grade": 3, "reason": "exact"}'),  # a 5xx first, then the answer
    "d2": ([], 0.0, '```json\n{"grade": 1, "reason": "other colour"}\n```'),
    "d4": ([], 0.0, "I cannot tell from an id."),  # malformed: no grade at all
}


class ChatServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ChatHandler)
        self.requests: list[dict[str, Any]] = []
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()


class ChatHandler(BaseHTTPRequestHandler):
    server: ChatServer

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if status in (429, 500):
            self.send_header("retry-after", "0")
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        req = json.loads(self.rfile.read(int(self.headers["content-length"])))
        doc = next(line.split(": ", 1)[1] for line in req["messages"][1]["content"].splitlines()
                   if line.startswith("Document id: "))
        with self.server.lock:
            self.server.requests.append({**req, "authorization": self.headers.get("authorization")})
            n = self.server.calls[doc]
            self.server.calls[doc] += 1
        errors, delay, content = CANNED[doc]
        if n < len(errors):
            self._send(errors[n], {"error": {"message": "busy"}})
            return
        time.sleep(delay)
        try:
            self._send(200, {"id": "c1", "object": "chat.completion", "model": req["model"],
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": content}}]})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout)


@pytest.fixture()
def chat() -> Iterator[ChatServer]:
    server = ChatServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _rows(db: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_parse_grade_strict_then_fallback_then_failure() -> None:
    assert parse_grade('{"grade": 2, "reason": "close"}', 3)[:3] == (2, "close", "json")
    assert parse_grade('```json\n{"grade": 3}\n```', 3)[:3] == (3, None, "json")
    assert parse_grade('{"grade": "1"}', 3).grade == 1
    assert parse_grade("Grade: 1 - a part of the asked product", 3)[:3] == (1, None, "fallback")
    assert parse_grade('{"grade": 5}', 3).failure == "grade 5 is outside 0..3"
    assert parse_grade('{"grade": 1.5}', 3).failure == "'grade' is 1.5, not an integer"
    assert parse_grade("grade 1 or grade 2", 3).failure == "the answer names several grades (1, 2)"
    assert parse_grade("no idea", 3).failure == "no JSON object with a 'grade' and no 'grade: n' in the answer"
    assert source_for("Qwen/Qwen2.5-7B-Instruct") == "model:Qwen-Qwen2.5-7B-Instruct"
    assert source_for("x", "model:gpt4") == "model:gpt4"
    msgs = build_messages("red shoes", "d1", {"title": "Red running shoe", "doc_id": "d1"}, "Be strict.", 3)
    assert msgs[1]["content"] == "Query: red shoes\nDocument id: d1\ntitle: Red running shoe"
    assert '{"grade": <an integer from 0 to 3>' in msgs[0]["content"] and "Be strict." in msgs[0]["content"]


def test_client_retries_then_gives_up_on_timeouts(chat: ChatServer) -> None:
    import httpx

    url = f"http://127.0.0.1:{chat.server_address[1]}/v1"
    waits: list[float] = []
    cfg = ClientSettings(endpoint=url, model="m", timeout_s=0.3, retries=2, backoff_s=0.01)
    with httpx.Client() as client:
        content, attempts, failure = ask(client, cfg, build_messages("q", "b2", None, "r", 3), waits.append)
    assert (content, attempts, failure) == (None, 3, "timed out after 0.3 s")
    assert waits == [0.01, 0.02]  # exponential backoff between the three attempts
    with httpx.Client() as client:
        content, attempts, failure = ask(client, cfg, build_messages("q", "h1", None, "r", 3), waits.append)
    assert (attempts, failure) == (2, None) and json.loads(content or "")["grade"] == 1  # 429, then the answer
    assert waits[-1] == 0.0  # Retry-After: 0 honoured
    with pytest.raises(JudgeError, match="expected an http"):
        ClientSettings(endpoint="api.openai.com/v1", model="m").url()


def test_ubi_judge_stores_a_model_source_measured_like_an_implicit_one(
        tmp_path: Path, chat: ChatServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    db = build_store(tmp_path / "ubi.duckdb")  # logs, and implicit:ctr candidates of 6 pairs
    assert main(["judgments", "import", str(write_human(tmp_path / "h.jsonl")), "--db", str(db)]) == 0
    capsys.readouterr()
    url = f"http://127.0.0.1:{chat.server_address[1]}/v1"
    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-test")
    argv = ["judge", "--db", str(db), "--endpoint", url, "--model", "test-llm", "--timeout", "0.5", "--retries", "1",
            "--api-key-env", "TEST_JUDGE_KEY", "--json"]
    assert main([*argv, "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert (dry["source"], dry["pairs"], chat.requests) == ("model:test-llm", 6, [])  # a dry run calls nothing
    assert main(argv) == 0
    run = json.loads(capsys.readouterr().out)
    # graded: h1 (after a 429), h2, d1 (after a 500), d2 (fenced); failed: b2 (timeout twice), d4 (malformed)
    assert (run["pairs"], run["graded"], run["failed"], run["fallback"]) == (6, 4, 2, 0)
    assert run["failures"] == {"timed out after 0.5 s": 1,
                               "no JSON object with a 'grade' and no 'grade: n' in the answer": 1}
    assert all(r["temperature"] == 0 and r["model"] == "test-llm" and r["authorization"] == "Bearer sk-test"
               for r in chat.requests)
    assert chat.calls == {"h1": 2, "h2": 1, "b2": 2, "d1": 2, "d2": 1, "d4": 1}
    stored = _rows(db, "SELECT query, doc_id, grade, model_version, parameters FROM judgments "
                       "WHERE source = 'model:test-llm' ORDER BY query, doc_id")
    assert [(q, d, g) for q, d, g, _v, _p in stored] == [
        ("blue hat", "h1", 1), ("blue hat", "h2", 0), ("green bag", "b2", None),
        ("red shoes", "d1", 3), ("red shoes", "d2", 1), ("red shoes", "d4", None)]
    params = {d: json.loads(p) for _q, d, _g, _v, p in stored}
    assert params["d4"]["answer"] == "I cannot tell from an id." and "grade" in params["d4"]["failure"]
    assert params["b2"]["failure"] == "timed out after 0.5 s" and "answer" not in params["b2"]
    assert (params["h1"]["attempts"], params["h1"]["reason"], params["h1"]["prompt_version"]) == (
        2, "a hat, wrong colour", "ubi-judge-2")
    assert "sk-test" not in json.dumps(params)  # the key is never stored

    # a second run asks only about the pairs without a grade yet (b2, d4)
    chat.requests.clear()
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["pairs"] == 2

    # the report measures model:test-llm on the human grades like implicit:ctr, and never recommends it
    out = tmp_path / "r.json"
    assert main(["report", "--db", str(db), "--format", "json", "--out", str(out), "--no-labels"]) == 0
    report = json.loads(out.read_text())
    model = report["agreement"]["model:test-llm"]
    # human (h1 2, h2 0, d1 3, d2 1) vs model (1, 0, 3, 1): O off-diagonal only (2, 1), Σ w·O = 1/9; marginals
    # human (1, 1, 1, 1), model (1, 2, 0, 1), N = 4: Σ w·E = (1/4)(1·14/9 + 2·6/9 + 1·14/9) = 10/9; kappa = 0.9
    assert model["pairs"] == 4 and model["kappa"] == pytest.approx(0.9)
    assert "model:test-llm" in report["sources"]
    assert (report["recommendation"] or {}).get("source") != "model:test-llm"

    # exported with its source, like any other
    assert main(["judgments", "export", "--db", str(db), "--source", "model:test-llm", "--format", "trec"]) == 0
    assert capsys.readouterr().out == ("blue%20hat 0 h1 1\nblue%20hat 0 h2 0\n"
                                       "red%20shoes 0 d1 3\nred%20shoes 0 d2 1\n")


def test_judge_never_runs_without_an_endpoint_and_needs_candidates(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    db = build_store(tmp_path / "ubi.duckdb", judgments=[])
    with pytest.raises(SystemExit):
        main(["judge", "--db", str(db), "--model", "m"])  # argparse: --endpoint is required, no default
    assert "--endpoint" in capsys.readouterr().err
    assert main(["judge", "--db", str(db), "--endpoint", "http://127.0.0.1:9/v1", "--model", "m"]) == 2
    assert "no pairs to judge" in " ".join(capsys.readouterr().err.split())


def test_import_model_judgments_keeps_them_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = build_store(tmp_path / "ubi.duckdb")
    llm = tmp_path / "llm.jsonl"
    llm.write_text('{"query_id": "q1", "query": "red shoes", "relevant": {"d1": 2, "d2": 1}, "assessor": "gpt"}\n')
    assert main(["judgments", "import", str(llm), "--db", str(db), "--source", "model:gpt", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["source"], got["judgments"], got["replaced"]) == ("model:gpt", 2, 0)
    assert _rows(db, "SELECT count(*) FROM human_judgments") == [(0,)]
    rows = _rows(db, "SELECT doc_id, grade, parameters FROM judgments WHERE source = 'model:gpt' ORDER BY doc_id")
    assert [(d, g) for d, g, _p in rows] == [("d1", 2), ("d2", 1)]
    assert json.loads(rows[0][2])["assessor"] == "gpt" and json.loads(rows[0][2])["imported"] is True
    # merged exports never use it unless a precedence names it
    assert main(["judgments", "export", "--db", str(db), "--source", "merged", "--format", "trec"]) == 0
    assert "red%20shoes 0 d1 3" in capsys.readouterr().out  # implicit:ctr's 3, not the model's 2
    assert main(["judgments", "export", "--db", str(db), "--source", "merged", "--precedence", "model:gpt,implicit",
                 "--format", "trec"]) == 0
    assert "red%20shoes 0 d1 2" in capsys.readouterr().out
    assert main(["judgments", "import", str(llm), "--db", str(db), "--source", "gpt"]) == 2
    assert "expected human or model:NAME" in capsys.readouterr().err


def test_bad_model_source_spellings_are_refused_naming_what_is_expected(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ubi judge --source llm:x` used to be rewritten to model:llm-x without a word, and `ubi judgments import
    --source "model:a,b"` stored a source that no --precedence list can name; both commands now use one rule."""
    db = build_store(tmp_path / "ubi.duckdb")
    llm = tmp_path / "llm.jsonl"
    llm.write_text('{"query_id": "q1", "query": "red shoes", "relevant": {"d1": 2}}\n')
    judge = ["judge", "--db", str(db), "--endpoint", "http://127.0.0.1:9/v1", "--model", "m", "--dry-run"]
    for source, expected in (("llm:x", "--source 'llm:x': expected model:NAME"),
                             ("model:", "--source 'model:': expected model:NAME, the name is missing"),
                             ("model:a,b", "--source 'model:a,b': the name 'a,b' may hold only letters, digits")):
        assert main([*judge, "--source", source]) == 2, source
        assert expected in " ".join(capsys.readouterr().err.split()), source
        assert main(["judgments", "import", str(llm), "--db", str(db), "--source", source]) == 2, source
        err = " ".join(capsys.readouterr().err.split())
        assert (expected if source != "llm:x" else "--source 'llm:x': expected human or model:NAME") in err, source
    assert _rows(db, "SELECT count(*) FROM judgments WHERE source LIKE 'model:%'") == [(0,)]
    assert source_for("llama3.1:8b") == "model:llama3.1-8b"  # a --model name is still made a source name


def test_judge_dry_run_lists_the_pairs_it_would_ask_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--help promises "print the pairs and the first prompt": the pairs were only counted."""
    db = build_store(tmp_path / "ubi.duckdb")  # implicit:ctr candidates of 6 pairs (joint_fixtures)
    argv = ["judge", "--db", str(db), "--endpoint", "http://127.0.0.1:9/v1", "--model", "m", "--dry-run", "--limit", "4"]
    assert main([*argv, "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["pairs"] == 4 and len(dry["queue"]) == 4
    first = dry["queue"][0]
    assert f"Query: {first['query']}\nDocument id: {first['doc_id']}" == dry["first_messages"][1]["content"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    for item in dry["queue"]:  # the same pairs, in the same order, in the text
        assert f"{item['query']}\t{item['doc_id']}" in text
    assert [ln.split("\t")[1] for ln in text.splitlines() if "\t" in ln] == [i["doc_id"] for i in dry["queue"]]


def test_people_and_the_model_judge_grade_under_one_default_rubric(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Without --rubric, `ubi review serve` showed people one scale text and `ubi judge` sent the model another
    (recorded as 'builtin@eea60af22978' and 'default (ubi-judge-1)' with another digest), so a model's agreement
    with people was measured across two rubrics. Both now use processors.labels.grades.default_rubric_text."""
    from ubi_pipeline.processors.labels.grades import default_rubric_text
    from ubi_pipeline.review.session import read_rubric

    db = build_store(tmp_path / "ubi.duckdb")
    assert main(["judge", "--db", str(db), "--endpoint", "http://127.0.0.1:9/v1", "--model", "m", "--dry-run",
                 "--json"]) == 0
    system = json.loads(capsys.readouterr().out)["first_messages"][0]["content"]
    assert default_rubric_text(3) in system
    people = read_rubric(None, 3)
    assert people.text == default_rubric_text(3)
    assert people.version == f"builtin@{rubric_digest(default_rubric_text(3))}"


def test_judge_reads_the_catalogue_the_review_page_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ubi judge --docs` had a reader of its own: it took a title of 5 and a javascript: url that `ubi review serve
    --docs` refuses (and sent them to the model). One reader now (processors/labels/catalog.py), one verdict."""
    db = build_store(tmp_path / "ubi.duckdb")
    judge = ["judge", "--db", str(db), "--endpoint", "http://127.0.0.1:9/v1", "--model", "m", "--dry-run", "--json"]
    for line, expected in (('{"doc_id": "d1", "title": 5}', "c.jsonl:1: 'title' must be a string, got int"),
                           ('{"doc_id": "d1", "url": "javascript:alert(1)"}', "c.jsonl:1: 'url' must be an http(s) URL")):
        catalog = tmp_path / "c.jsonl"
        catalog.write_text(line + "\n")
        assert main([*judge, "--docs", str(catalog)]) == 2
        assert expected in " ".join(capsys.readouterr().err.split())
    # a good line: the text fields go to the model, the image does not
    docs = {"doc_id": "d1", "title": "Red running shoe", "image": "https://img.example/d1.jpg"}
    assert build_messages("red shoes", "d1", docs, "Be strict.", 3)[1]["content"] == (
        "Query: red shoes\nDocument id: d1\ntitle: Red running shoe")


def test_report_help_names_model_sources(capsys: pytest.CaptureFixture[str]) -> None:
    """`ubi report --sources model:NAME` works, but its help offered only "implicit (or reviewed) sources"."""
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "implicit, model (or reviewed) sources to evaluate" in text
    assert "the implicit and model labels with the human ones" in text


def test_a_model_export_says_whose_grades_and_cannot_come_back_as_human(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ubi judgments export --source model:gpt --format jsonl` wrote lines that said nothing of the model, and
    `ubi judgments import` (default --source human) took them as people's grades. Lines now carry "source"."""
    db = build_store(tmp_path / "ubi.duckdb")
    llm = tmp_path / "llm.jsonl"
    llm.write_text('{"query_id": "q1", "query": "red shoes", "relevant": {"d1": 2, "d2": 1}}\n')
    assert main(["judgments", "import", str(llm), "--db", str(db), "--source", "model:gpt"]) == 0
    out = tmp_path / "out.jsonl"
    assert main(["judgments", "export", "--db", str(db), "--source", "model:gpt", "--format", "jsonl",
                 "--out", str(out)]) == 0
    line = json.loads(out.read_text())
    assert (line["source"], line["relevant"]) == ("model:gpt", {"d1": 2, "d2": 1})
    capsys.readouterr()
    assert main(["judgments", "import", str(out), "--db", str(db)]) == 2
    assert (f"{out}:1: query 'red shoes' names source 'model:gpt', not human: import it with --source model:gpt"
            in " ".join(capsys.readouterr().err.split()))
    assert _rows(db, "SELECT count(*) FROM human_judgments") == [(0,)]
    # as a model source it round-trips
    assert main(["judgments", "import", str(out), "--db", str(db), "--source", "model:gpt2"]) == 0
    assert _rows(db, "SELECT doc_id, grade FROM judgments WHERE source = 'model:gpt2' ORDER BY doc_id") == [
        ("d1", 2), ("d2", 1)]
    # people's grades are written as before, without a source
    assert main(["judgments", "import", str(llm), "--db", str(db), "--assessor", "ann"]) == 0
    assert main(["judgments", "export", "--db", str(db), "--format", "jsonl", "--out", str(out)]) == 0
    assert "source" not in json.loads(out.read_text())
