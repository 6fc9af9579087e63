"""Paging through ``failed_records``: what ``GET /v1/failed`` and ``ubi failed`` show."""

from __future__ import annotations

import base64
from typing import Any

from ubi_pipeline.store.duckdb_store import Store


def raw_text(raw: bytes | None) -> tuple[str | None, str | None]:
    """Bytes as UTF-8 text when they are, else base64; with the encoding used."""
    if raw is None:
        return None, None
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"


def failed_page(store: Store, *, limit: int, offset: int, kind: str | None = None) -> dict[str, Any]:
    """A page of ``failed_records``, newest first (shared by ``GET /v1/failed`` and ``ubi failed``)."""
    where, params = ("WHERE kind = ?", [kind]) if kind else ("", [])
    ((total,),) = store.read(f"SELECT count(*) FROM failed_records {where}", params)
    rows = store.read(
        "SELECT failed_id, received_at, source, kind, item_index, field, reason, raw, kafka_topic, "
        f"kafka_partition, kafka_offset FROM failed_records {where} "
        "ORDER BY received_at DESC, failed_id LIMIT ? OFFSET ?",
        [*params, limit, offset],
    )
    items = []
    for r in rows:
        raw, enc = raw_text(r[7])
        items.append(
            {
                "failed_id": r[0],
                "received_at": r[1].isoformat() + "Z",
                "source": r[2],
                "kind": r[3],
                "item_index": r[4],
                "field": r[5],
                "reason": r[6],
                "raw": raw,
                "raw_encoding": enc,
                "kafka_topic": r[8],
                "kafka_partition": r[9],
                "kafka_offset": r[10],
            }
        )
    nxt = offset + len(items)
    return {"total": total, "offset": offset, "items": items, "next_offset": nxt if nxt < total else None}
