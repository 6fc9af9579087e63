"""What a file given to ``ubi import`` probably is, when it is not UBI records, and the command that reads it.

``ubi import`` takes UBI queries and events (NDJSON, JSON arrays, OpenSearch ``_bulk`` exports). Judgment
files, run files, query sets and spreadsheets are other commands' input; when every record of such a file
is rejected, the import names the likely right command instead of leaving the user with a page of
"'action_name' is required". The guess reads the first few kilobytes only.

Two shapes are certain enough to refuse before anything is read into the store (:func:`not_ubi_records`):
an OpenSearch search request carrying an ``ext.ubi`` block (what a search page sends to OpenSearch, from
which the UBI plugin logs the query record) and a search-quality dashboard metrics file (``_bulk`` rows of
per-query metric values, as ``ubi report --dashboard`` writes them). Importing either gave one field error per
item and copied every item into ``failed_records`` (1,680 for the dashboards' sample file).
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson

_HEAD_BYTES = 64 * 1024
_TREC_QRELS = re.compile(rb"^\S+\s+\S+\s+\S+\s+-?\d+(\.\d+)?\s*$")
_TREC_RUN = re.compile(rb"^\S+\s+Q0\s+\S+\s+\d+\s+\S+\s+\S+\s*$", re.IGNORECASE)


def _first_line(head: bytes) -> bytes:
    for line in head.splitlines():
        if line.strip():
            return line.strip()
    return b""


#: The keys of a dashboard metrics row (reports/render/dashboard.py, the dashboards' sample file).
_METRIC_ROW_KEYS = frozenset({"search_config", "query_set_id", "metric", "value"})


def _head(path: Path) -> tuple[bytes, bool] | None:
    """The first :data:`_HEAD_BYTES` of ``path`` without a UTF-8 BOM, and whether that is the whole file."""
    try:
        with path.open("rb") as fh:
            head = fh.read(_HEAD_BYTES + 1)
    except OSError:
        return None
    whole = len(head) <= _HEAD_BYTES
    head = head[:_HEAD_BYTES]
    return (head[3:] if head.startswith(b"\xef\xbb\xbf") else head), whole


def _first_objects(head: bytes, whole: bool) -> list[object]:
    """The file as one JSON value when it is one (pretty-printed included), else its first two JSON lines."""
    if whole:
        try:
            return [orjson.loads(head)]
        except orjson.JSONDecodeError:
            pass
    out: list[object] = []
    for line in head.splitlines():
        if line.strip():
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                return out
            if len(out) == 2:
                break
    return out


def _is_search_request(value: object) -> bool:
    if isinstance(value, list) and value:
        value = value[0]
    if not isinstance(value, dict) or "action_name" in value or "user_query" in value:
        return False
    ext = value.get("ext")
    return isinstance(ext, dict) and isinstance(ext.get("ubi"), dict)


def not_ubi_records(path: Path) -> str | None:
    """What ``path`` is when it is certainly not UBI records (a search request with ``ext.ubi``, a dashboard
    metrics file) and what to do with it instead; None otherwise (then the import reads it)."""
    got = _head(path)
    if got is None:
        return None
    values = _first_objects(*got)
    if values and _is_search_request(values[0]):
        return (f"{path} is an OpenSearch search request with an ext.ubi block, not UBI records: send it to "
                f"OpenSearch, whose UBI plugin stores the query record, or post the query record itself (the "
                f"ext.ubi object with a timestamp) to the collector's /v1/queries; `ubi schema --kind query` "
                f"shows its fields")
    if len(values) == 2 and isinstance(values[0], dict) and isinstance(values[1], dict):
        action = values[0].get("index") or values[0].get("create")
        if isinstance(action, dict) and _METRIC_ROW_KEYS <= values[1].keys():
            index = action.get("_index") or "its index"
            return (f"{path} is a search-quality dashboard metrics file (_bulk rows of per-query metric values, "
                    f"as `ubi report --dashboard` writes), not UBI records: load it into OpenSearch for the "
                    f"dashboards, e.g. `curl -H 'Content-Type: application/x-ndjson' -XPOST "
                    f"http://localhost:9200/_bulk --data-binary @{path}` (it goes to {index})")
    return None


def likely_command(path: Path) -> str | None:
    """A sentence naming what ``path`` looks like and the command for it, or None when it looks like UBI data."""
    try:
        with path.open("rb") as fh:
            head = fh.read(_HEAD_BYTES)
    except OSError:
        return None
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:]
    stripped = head.lstrip()
    if b'"judgmentRatings"' in head:
        return (f"{path} looks like a Search Relevance Workbench judgment file: load it with "
                f"`ubi judgments import {path}` (or give it to `ubi report --qrels`)")
    if b'"querySetQueries"' in head:
        return (f"{path} looks like a Workbench query set: use it with `ubi review export --queries {path}` or "
                f"`ubi judgments import --queries {path}`")
    line = _first_line(head)
    if line.startswith(b"{"):
        try:
            first = orjson.loads(line)
        except orjson.JSONDecodeError:
            first = None
        if isinstance(first, dict) and "relevant" in first:
            return (f"{path} looks like human judgments (JSONL qrels): load them with `ubi judgments import {path}` "
                    f"(or give them to `ubi report --qrels`)")
        if isinstance(first, dict) and "doc_ids" in first and "action_name" not in first:
            return f"{path} looks like a JSONL run (rankings): evaluate it with `ubi report --run {path}`"
        return None
    if stripped.startswith(b"["):
        return None
    if _TREC_RUN.match(line):
        return f"{path} looks like a TREC run: evaluate it with `ubi report --run {path}` or `ubi evaluate --run {path}`"
    if _TREC_QRELS.match(line):
        return (f"{path} looks like TREC qrels: load them with `ubi judgments import {path}` "
                f"(or give them to `ubi report --qrels`)")
    if b"," in line or b"\t" in line:
        return (f"{path} looks like a CSV or TSV table: ubi import reads UBI records as NDJSON, JSON arrays or "
                f"OpenSearch _bulk exports; a graded review sheet goes in with `ubi review import {path}`")
    return None
