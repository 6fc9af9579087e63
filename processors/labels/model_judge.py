"""Model judgments: grades proposed by a language model through an OpenAI-compatible chat-completions endpoint.

A model judge is one more label source, ``model:<name>``, stored in the ``judgments`` table beside the implicit
sources (never in ``human_judgments``), so the report measures its agreement with held-out human grades like
any implicit source's, and no default precedence ever lets it stand in for a person's grade.

The protocol: ``POST {endpoint}/chat/completions`` with ``{"model", "messages", "temperature": 0}`` (the OpenAI
Chat Completions request that OpenAI, vLLM, Ollama, llama.cpp's server and most gateways accept); the grade is
read from ``choices[0].message.content``. The prompt asks for one JSON object ``{"grade": n, "reason": "..."}``;
:func:`parse_grade` reads that strictly (the whole answer, or one fenced ```json block), and falls back to a
``grade: n`` phrase; anything else is a failure with its reason. Every answer is kept: the stored row's
``parameters`` holds the prompt version, the rubric's name and digest, the endpoint, the raw answer (first
:data:`ANSWER_KEPT` characters), the reason, how the grade was parsed, the attempts, and on failure
``failure`` with ``grade`` NULL, so a failed pair is visible and a later run replaces it.

Calls are retried on 429 and 5xx answers and on timeouts or refused connections, with exponential backoff
(``Retry-After`` honoured up to :data:`MAX_WAIT_S`), at most ``concurrency`` at once. Nothing here has a default
endpoint: a model is only called by ``ubi judge --endpoint URL --model NAME``.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import duckdb
import httpx
import orjson
import pyarrow as pa

from ubi_pipeline.processors.labels.grades import default_rubric_text
from ubi_pipeline.processors.labels.queue import Candidate, HumanGrade, build_queue
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.judgments import MODEL_PREFIX, model_source_problem
from ubi_pipeline.schemas.text import normalize_query
from ubi_pipeline.store.rows import JUDGMENT_SCHEMA, utcnow

#: bumped whenever the messages below change, so grades from different prompts are told apart
PROMPT_VERSION = "ubi-judge-2"
#: characters of each answer kept in the row's parameters
ANSWER_KEPT = 2_000
#: longest wait between two attempts, whatever Retry-After asks
MAX_WAIT_S = 30.0

class JudgeError(UbiError):
    """A model judge cannot run as asked (no pairs, a bad endpoint URL, a bad source name)."""


def source_for(model: str, name: str | None = None) -> str:
    """``model:<name>``: the given ``name`` (``--source``) as it is, when it is a valid model source name (a bad
    spelling such as ``llm:x`` or ``model:`` is an error, never silently rewritten); else the model's name with
    characters outside [A-Za-z0-9._-] as '-'."""
    if name is not None:
        problem = model_source_problem(name)
        if problem:
            raise JudgeError(f"--source {name!r}: {problem}")
        return name
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", model.strip()).strip("-")
    if not cleaned:
        raise JudgeError(f"--model {model!r}: cannot make a source name of it; give --source model:NAME")
    return MODEL_PREFIX + cleaned


def rubric_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


#: the catalogue fields a model is shown (text; an image URL is no use to a text model)
MODEL_DOC_FIELDS = ("title", "description", "url")


def build_messages(query: str, doc_id: str, doc_fields: Mapping[str, Any] | None, rubric: str,
                   grade_max: int) -> list[dict[str, str]]:
    """The chat messages for one pair: the rubric and the answer format, then the query and the document."""
    system = (f"You are a search relevance assessor.\n{rubric.strip()}\n\nAnswer with one JSON object and nothing "
              f'else: {{"grade": <an integer from 0 to {grade_max}>, "reason": "<one short sentence>"}}')
    lines = [f"Query: {query}", f"Document id: {doc_id}"]
    for key, value in (doc_fields or {}).items():
        if key in MODEL_DOC_FIELDS and value not in (None, ""):
            lines.append(f"{key}: {value}")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(lines)}]


class Parsed(NamedTuple):
    """A grade read from an answer (None: the failure says why), its reason and how it was read."""

    grade: int | None
    reason: str | None
    how: str  # json | fallback | failed
    failure: str | None = None


_FENCE = re.compile(r"^\s*```(?:json)?\s*(\{.*\})\s*```\s*$", re.S)
_LOOSE = re.compile(r"\bgrade\b\W{0,3}\s*(\d+)", re.I)


def parse_grade(answer: str, grade_max: int) -> Parsed:
    """The grade of an answer: the whole answer (or its one fenced block) as a JSON object with an integer
    ``grade`` in 0..grade_max; else a ``grade: n`` phrase (``how="fallback"``); else a failure with its reason."""
    text = answer.strip()
    fenced = _FENCE.match(text)
    body = fenced.group(1) if fenced else text
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict) and "grade" in obj:
        grade = obj["grade"]
        reason = obj.get("reason") if isinstance(obj.get("reason"), str) else None
        if isinstance(grade, str) and grade.strip().isdigit():
            grade = int(grade.strip())
        if isinstance(grade, bool) or not isinstance(grade, int):
            return Parsed(None, reason, "failed", f"'grade' is {grade!r}, not an integer")
        if not 0 <= grade <= grade_max:
            return Parsed(None, reason, "failed", f"grade {grade} is outside 0..{grade_max}")
        return Parsed(grade, reason, "json")
    loose = _LOOSE.findall(text)
    if len(set(loose)) == 1:
        grade = int(loose[0])
        if 0 <= grade <= grade_max:
            return Parsed(grade, None, "fallback")
        return Parsed(None, None, "failed", f"grade {grade} is outside 0..{grade_max}")
    if len(set(loose)) > 1:
        return Parsed(None, None, "failed", f"the answer names several grades ({', '.join(sorted(set(loose)))})")
    return Parsed(None, None, "failed", "no JSON object with a 'grade' and no 'grade: n' in the answer")


@dataclass(frozen=True)
class ClientSettings:
    """How to reach the endpoint: base URL (``.../v1``), model, key, timeout per request, retries, concurrency."""

    endpoint: str
    model: str
    api_key: str | None = None
    timeout_s: float = 60.0
    retries: int = 4
    backoff_s: float = 1.0  # first wait; doubled on each retry
    concurrency: int = 4
    temperature: float = 0.0

    def url(self) -> str:
        base = self.endpoint.rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise JudgeError(f"--endpoint {self.endpoint!r}: expected an http:// or https:// URL such as "
                             "https://api.openai.com/v1")
        return base + "/chat/completions"


@dataclass(frozen=True)
class Answer:
    """One pair's outcome: the raw answer (None when no answer came), the parsed grade, attempts, failure."""

    query: str
    doc_id: str
    content: str | None
    parsed: Parsed | None
    attempts: int
    failure: str | None
    seconds: float


def _retry_wait(resp: httpx.Response | None, attempt: int, backoff_s: float) -> float:
    wait = backoff_s * (2 ** attempt)
    if resp is not None:
        after = resp.headers.get("retry-after")
        if after is not None:
            try:
                wait = float(after)
            except ValueError:
                pass
    return min(max(wait, 0.0), MAX_WAIT_S)


def ask(client: httpx.Client, cfg: ClientSettings, messages: list[dict[str, str]],
        sleep: Callable[[float], None] = time.sleep) -> tuple[str | None, int, str | None]:
    """One chat completion with retries: (content, attempts, failure). Retried: 429, 5xx, timeouts, refused
    connections; other 4xx and malformed responses fail at once (a retry would get the same)."""
    body = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature}
    headers = {"authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    failure = None
    for attempt in range(cfg.retries + 1):
        resp = None
        try:
            resp = client.post(cfg.url(), json=body, headers=headers, timeout=cfg.timeout_s)
        except httpx.TimeoutException:
            failure = f"timed out after {cfg.timeout_s:g} s"
        except httpx.TransportError as exc:
            failure = f"could not reach {cfg.url()}: {exc}"
        else:
            if resp.status_code == 429 or resp.status_code >= 500:
                failure = f"HTTP {resp.status_code}: {resp.text[:200]}"
            elif resp.status_code >= 400:
                return None, attempt + 1, f"HTTP {resp.status_code}: {resp.text[:300]}"
            else:
                try:
                    content = resp.json()["choices"][0]["message"]["content"]
                except (ValueError, KeyError, IndexError, TypeError):
                    return None, attempt + 1, f"not a chat completion: {resp.text[:300]}"
                if not isinstance(content, str):
                    return None, attempt + 1, f"the message content is {type(content).__name__}, not text"
                return content, attempt + 1, None
        if attempt < cfg.retries:
            sleep(_retry_wait(resp, attempt, cfg.backoff_s))
    return None, cfg.retries + 1, failure


def judge_pairs(pairs: Sequence[tuple[str, str]], cfg: ClientSettings, *, rubric: str | None = None,
                grade_max: int = 3, docs: Mapping[str, Mapping[str, Any]] | None = None,
                transport: httpx.BaseTransport | None = None,
                sleep: Callable[[float], None] = time.sleep) -> list[Answer]:
    """Ask the endpoint for a grade of every pair, at most ``cfg.concurrency`` at once; answers in pair order."""
    cfg.url()  # a bad URL fails before any call
    docs = docs or {}

    text = rubric if rubric is not None else default_rubric_text(grade_max)

    def one(client: httpx.Client, pair: tuple[str, str]) -> Answer:
        query, doc_id = pair
        start = time.monotonic()
        content, attempts, failure = ask(client, cfg, build_messages(query, doc_id, docs.get(doc_id), text,
                                                                     grade_max), sleep)
        parsed = parse_grade(content, grade_max) if content is not None else None
        if parsed is not None and parsed.failure:
            failure = parsed.failure
        return Answer(query, doc_id, content, parsed, attempts, failure, time.monotonic() - start)

    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    with httpx.Client(limits=limits, transport=transport) as client, \
            ThreadPoolExecutor(max_workers=max(1, cfg.concurrency)) as pool:
        return list(pool.map(lambda p: one(client, p), pairs))


@dataclass(frozen=True)
class JudgeRun:
    """What one ``ubi judge`` run asked and got."""

    source: str
    model: str
    prompt_version: str
    pairs: int
    graded: int
    failed: int
    fallback: int
    failures: dict[str, int] = field(default_factory=dict)  # failure -> count (first 80 characters)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def judgment_rows(answers: Iterable[Answer], source: str, cfg: ClientSettings, *, rubric: str, rubric_name: str,
                  now: datetime | None = None) -> pa.Table:
    """``judgments`` rows of the answers: grade (NULL on failure) and the provenance in ``parameters``."""
    created = now or utcnow()
    endpoint = cfg.endpoint.rstrip("/")
    rows = []
    for a in answers:
        params: dict[str, Any] = {
            "model": {"name": cfg.model, "kind": "chat-completions"}, "prompt_version": PROMPT_VERSION,
            "rubric": {"name": rubric_name, "sha256_12": rubric_digest(rubric)}, "endpoint": endpoint,
            "temperature": cfg.temperature, "attempts": a.attempts,
        }
        if a.content is not None:
            params["answer"] = a.content[:ANSWER_KEPT]
        if a.parsed is not None:
            params["parsed"] = a.parsed.how
            if a.parsed.reason:
                params["reason"] = a.parsed.reason[:ANSWER_KEPT]
        if a.failure:
            params["failure"] = a.failure
        grade = a.parsed.grade if a.parsed is not None and not a.failure else None
        rows.append({"query": a.query, "doc_id": a.doc_id, "source": source, "model_version": cfg.model,
                     "parameters": orjson.dumps(params).decode(), "score": None if grade is None else float(grade),
                     "grade": grade, "created_at": created})
    return pa.Table.from_pylist(rows, schema=JUDGMENT_SCHEMA)


def summarize(answers: Sequence[Answer], source: str, model: str) -> JudgeRun:
    failures: dict[str, int] = {}
    for a in answers:
        if a.failure:
            key = a.failure[:80]
            failures[key] = failures.get(key, 0) + 1
    graded = sum(1 for a in answers if not a.failure and a.parsed is not None and a.parsed.grade is not None)
    fallback = sum(1 for a in answers if not a.failure and a.parsed is not None and a.parsed.how == "fallback")
    return JudgeRun(source, model, PROMPT_VERSION, len(answers), graded, len(answers) - graded, fallback,
                    dict(sorted(failures.items(), key=lambda kv: -kv[1])))


def pairs_to_judge(con: duckdb.DuckDBPyConnection, source: str, *, limit: int | None = None,
                   rejudge: bool = False, held_out: int = 50, seed: int = 0) -> list[tuple[str, str]]:
    """The (query, doc) pairs to ask the model about, in the review queue's order
    (:func:`ubi_pipeline.processors.labels.queue.build_queue`, the order ``ubi review serve`` serves people): its
    stratified held-out sample first, on which the report measures every source against people, then the pairs
    whose sources and grades disagree most, with the widest intervals, on the most searched queries. Pairs this
    model already graded are skipped unless ``rejudge``.
    """
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if "judgments" not in tables:
        return []
    candidates = [Candidate(*r) for r in con.execute(
        "SELECT query, doc_id, source, score, ci_low, ci_high, impressions, clicks, sessions, grade FROM judgments"
    ).fetchall()]
    humans = [] if "human_judgments" not in tables else [HumanGrade(*r) for r in con.execute(
        "SELECT query, doc_id, assessor, grade, source FROM human_judgments").fetchall()]
    freq: dict[str, int] = {}
    if "ubi_queries" in tables:
        for text, n in con.execute("SELECT user_query, count(*) FROM ubi_queries GROUP BY user_query").fetchall():
            q = normalize_query(text or "")
            freq[q] = freq.get(q, 0) + int(n)
    done = set() if rejudge else {(c.query, c.doc_id) for c in candidates if c.source == source and c.grade is not None}
    items = build_queue(candidates, humans, freq, held_out=held_out, seed=seed)
    pairs = [it.pair for it in items if it.pair not in done]
    return pairs if limit is None else pairs[:limit]
