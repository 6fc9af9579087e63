"""The same UBI records written in each producer's byte layout, for the ``--shapes`` mode of
``bench/import_speed.py`` and ``bench/ingest.py`` (not a bench itself).

The records are the project's simulator's (:func:`ubi_pipeline.processors.simulation.bulk_log.write_files`);
each shape rewrites every record as that producer writes it:

* ``simulator``: as the simulator writes them (compact, ``event_id`` on every event, millisecond ``Z`` times);
* ``js-client``: as the reference JavaScript client (``../shared/ubi-clients/opensearch-ubi-js/ubi.js``)
  serialises them: ``JSON.stringify`` of its classes (their field order, compact, non-ASCII as is), no
  ``event_id`` (the key is the content hash), ``user_id: ""``, ``message: ""``, ``message_type: "INFO"``,
  ``description`` and free-form details inside ``object``, ``toISOString()`` times; query records without
  ``query_response_hit_ids`` (the client sends none);
* ``python-json``: ``json.dumps`` with its default separators (a space after ``,`` and ``:``, ``\\u``
  escapes), no ``event_id``, times from ``datetime.isoformat()`` (microseconds, ``+00:00``);
* ``logstash-bulk``: an OpenSearch ``_bulk`` export as Logstash's opensearch output writes it: an ``index``
  action with ``_index`` and ``_id`` (the document id), the document with ``@timestamp`` and ``@version`` added,
  no ``event_id`` in it;
* ``dataprepper-bulk``: an ``_bulk`` export as Data Prepper's opensearch sink writes it without a
  ``document_id``: ``index`` actions naming only ``_index``, compact documents, no ids (content-hash keys),
  times to the second.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

SHAPES = ("simulator", "js-client", "python-json", "logstash-bulk", "dataprepper-bulk")
#: Shapes written as an OpenSearch _bulk export (the others as one NDJSON file per kind).
BULK_SHAPES = ("logstash-bulk", "dataprepper-bulk")

_JS_EVENT_ORDER = ("application", "action_name", "query_id", "session_id", "client_id", "user_id", "timestamp",
                   "message_type", "message", "event_attributes")
_JS_QUERY_ORDER = ("application", "query_id", "client_id", "user_query", "query_attributes", "object_id_field",
                   "timestamp")


def _js(record: dict[str, Any], kind: str) -> dict[str, Any]:
    if kind == "query":
        return {k: record[k] for k in _JS_QUERY_ORDER if record.get(k) is not None}
    out = {**record, "user_id": "", "message_type": "INFO", "message": record.get("message") or ""}
    attrs = out.get("event_attributes")
    if attrs and attrs.get("object"):
        obj = attrs["object"]
        # UbiEventAttributes: object_id, object_id_field, description, then the details spread in
        attrs = {**attrs, "object": {"object_id": obj.get("object_id"), "object_id_field": obj.get("object_id_field"),
                                     "description": f"product {obj.get('object_id')}", "brand": "acme"}}
        out["event_attributes"] = attrs
    return {k: out[k] for k in _JS_EVENT_ORDER if out.get(k) is not None}


def _iso(ts: str, *, seconds: bool = False) -> str:
    when = datetime.fromisoformat(ts)
    return when.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ") if seconds else when.isoformat()


def _without_id(record: dict[str, Any], kind: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "event_id"} if kind == "event" else dict(record)


def _records(sim: list[Path]) -> Iterator[tuple[str, bytes, dict[str, Any]]]:
    """(kind, line, record) of the simulator's NDJSON files (``ubi_queries.ndjson``, ``ubi_events.ndjson``)."""
    for path in sim:
        kind = "query" if "queries" in path.name else "event"
        with open(path, "rb") as fh:
            for line in fh:
                line = line.rstrip(b"\n")
                if line:
                    yield kind, line, orjson.loads(line)


def write_shape(shape: str, sim: list[Path], folder: Path) -> list[Path]:
    """The simulator's files ``sim`` rewritten in ``shape`` under ``folder``; the files, query records first."""
    folder.mkdir(parents=True, exist_ok=True)
    if shape in BULK_SHAPES:
        path = folder / f"{shape}.bulk.ndjson"
        with open(path, "wb") as out:
            for kind, _, rec in _records(sim):
                index = "ubi_queries" if kind == "query" else "ubi_events"
                if shape == "logstash-bulk":
                    doc_id = rec.get("query_id") if kind == "query" else rec.get("event_id")
                    doc = {**_without_id(rec, kind), "@timestamp": rec.get("timestamp"), "@version": "1"}
                    action: dict[str, Any] = {"index": {"_index": index, "_id": doc_id}}
                else:
                    doc = _without_id(rec, kind)
                    if doc.get("timestamp"):
                        doc["timestamp"] = _iso(doc["timestamp"], seconds=True)
                    action = {"index": {"_index": index}}
                out.write(orjson.dumps(action) + b"\n" + orjson.dumps(doc) + b"\n")
        return [path]
    files = []
    for src in sim:
        path = folder / f"{shape}-{src.name}"
        with open(path, "wb") as out:
            for kind, line, rec in _records([src]):
                out.write(_rewrite(shape, kind, line, rec) + b"\n")
        files.append(path)
    return sorted(files, key=lambda p: "0" if "queries" in p.name else p.name)


def render(shape: str, kind: str, rec: dict[str, Any]) -> bytes:
    """One record (the simulator's fields) as ``shape``'s producer writes it (the NDJSON shapes only)."""
    return _rewrite(shape, kind, orjson.dumps(rec), rec)


def _rewrite(shape: str, kind: str, line: bytes, rec: dict[str, Any]) -> bytes:
    """One NDJSON record of the simulator in ``shape``."""
    if shape == "simulator":
        return line
    if shape == "js-client":
        return json.dumps(_js(rec, kind), separators=(",", ":"), ensure_ascii=False).encode()
    doc = _without_id(rec, kind)
    if doc.get("timestamp"):
        doc["timestamp"] = _iso(doc["timestamp"])
    return json.dumps(doc).encode()
