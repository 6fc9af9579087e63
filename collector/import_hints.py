"""What a file given to ``ubi import`` probably is, when it is not UBI records, and the command that reads it.

``ubi import`` takes UBI queries and events (NDJSON, JSON arrays, OpenSearch ``_bulk`` exports). Judgment
files, run files, query sets and spreadsheets are other commands' input; when every record of such a file
is rejected, the import names the likely right command instead of leaving the user with a page of
"'action_name' is required". The guess reads the first few kilobytes only.
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
