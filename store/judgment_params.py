"""Judgment parameters: the run-wide part stored once per run, the pair's own part on its row, read as one dict.

A click model's run writes one ``judgments`` row per (query, doc). Most of what its ``parameters`` say is the
same for every row of the run: the model's fitted prior and position parameters, the grade mapping, the
limits, the identifiability verdict, ``--model auto``'s selection (about 1.3 KB). Only ``observations`` and,
with human grades, ``calibration_split`` are the pair's own. So the run-wide document is stored once, in
``judgment_runs`` under ``(source, run_id)``, and each row keeps its own keys and the ``run_id``
(``ubi_pipeline.schemas.tables``). At 20M events that is 416,660 rows: 540 MB of repeated JSON as Arrow before, more
inside DuckDB's ``INSERT OR REPLACE`` transaction (which does not spill).

Readers see one dict per row, the same as before the split: the run's keys in their order, then the row's
(``calibration_split``, ``observations``). :class:`ParameterMerger` builds it; the run-wide dict is parsed
once per run and *shared* between the rows' dicts (copied shallowly): read it, do not change its nested
values. Rows written before the split (``run_id`` NULL, the whole document in ``parameters``) are read too:
their shared part is split off in SQL (:func:`parameter_columns`) and parsed once per distinct text, so an
old store costs no more to read than before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.store.sql import checked_columns

#: The keys of a judgment's parameters that differ from row to row, in the order a row's dict ends with.
PER_ROW_KEYS = ("calibration_split", "observations")

_MISSING = object()


def run_id(parameters_text: str) -> str:
    """The id of a run-wide parameters document: a digest of its JSON text (the same run stores one row)."""
    return hashlib.sha256(parameters_text.encode()).hexdigest()[:24]


def table_columns(con: duckdb.DuckDBPyConnection, table: str) -> tuple[str, ...]:
    """The columns of ``table`` in this connection (main schema or a view), empty when it does not exist."""
    return tuple(r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_catalog = current_database() "
        "AND table_schema = 'main' AND table_name = ? ORDER BY ordinal_position",
        [table]).fetchall())


def parameter_columns(alias: str = "", *, split: bool = True) -> str:
    """SQL for the five columns :class:`ParameterMerger` takes, from ``judgments`` (aliased ``alias``).

    ``run_id``; the row's own text (new rows' ``parameters``, or an old row's whole value when it is not an
    object); and, for old rows holding an object: the object without its per-row keys, and each per-row key's
    JSON value. ``split=False`` is for a store whose ``judgments`` has no ``run_id`` yet (made before it).
    """
    p = f"{alias}.parameters" if alias else "parameters"
    r = f"{alias}.run_id" if alias else "run_id"
    old = f"{r} IS NULL AND json_type({p}) = 'OBJECT'" if split else f"json_type({p}) = 'OBJECT'"
    nulls = "{" + ", ".join(f'"{k}": null' for k in PER_ROW_KEYS) + "}"
    return ", ".join([
        r if split else "NULL::VARCHAR",
        f"CASE WHEN {old} THEN NULL ELSE {p} END",
        f"CASE WHEN {old} THEN json_merge_patch({p}, '{nulls}') END",
        *(f"CASE WHEN {old} THEN json_extract({p}, '$.{k}') END" for k in PER_ROW_KEYS),
    ])


def _json_obj(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        return {"raw": str(value)}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


class ParameterMerger:
    """Each row's ``parameters`` dict from the stored parts, with what rows share parsed once.

    ``runs`` maps ``(source, run_id)`` to the run-wide JSON text (:func:`stored_runs`, :func:`arrow_runs`).
    Call it with a row's source and the columns of :func:`parameter_columns`.

    ``share``: rows whose stored parts are the same text get the *same* dict object (a run's rows differ only in
    ``observations``: about 20 distinct dicts for 100,000 rows), for readers that hold every row at once and
    only read the dicts (``ubi_pipeline.processors.labels.merge.labels_from_store``: about 1.3 KB a row otherwise).
    """

    def __init__(self, runs: Mapping[tuple[str, str], str], *, share: bool = False) -> None:
        self.runs = runs
        self.merged: dict[tuple[str | None, ...], dict[str, Any] | None] | None = {} if share else None
        self.parsed_runs: dict[tuple[str, str], dict[str, Any]] = {}
        self.shared: dict[str, dict[str, Any]] = {}
        self.own: dict[str, dict[str, Any] | None] = {}
        self.values: dict[str, Any] = {}

    def __call__(self, source: str, run: str | None, own: str | None, shared: str | None = None,
                 *per_row: str | None) -> dict[str, Any] | None:
        if self.merged is None:
            return self._merge(source, run, own, shared, *per_row)
        key = (source, run, own, shared, *per_row)
        out = self.merged.get(key, _MISSING)
        if out is _MISSING:
            out = self.merged[key] = self._merge(source, run, own, shared, *per_row)
        return out  # type: ignore[return-value]

    def _merge(self, source: str, run: str | None, own: str | None, shared: str | None = None,
               *per_row: str | None) -> dict[str, Any] | None:
        if run is not None:
            base = self.parsed_runs.get((source, run))
            if base is None:
                text = self.runs.get((source, run))
                if text is None:
                    raise StoreError(f"judgments of source {source!r} refer to run {run!r}, which judgment_runs "
                                     "does not hold; run `ubi process` for that model again")
                base = self.parsed_runs[(source, run)] = _json_obj(text) or {}
            out = dict(base)
            mine = self._own(own)
            if mine:
                out.update(mine)
            return out
        if shared is None:
            return _json_obj(own)  # an old row whose parameters are not an object (or NULL)
        base = self.shared.get(shared)
        if base is None:
            base = self.shared[shared] = json.loads(shared)
        out = dict(base)
        for key, value in zip(PER_ROW_KEYS, per_row, strict=True):
            if value is not None:
                parsed = self.values.get(value, _MISSING)
                if parsed is _MISSING:
                    parsed = self.values[value] = json.loads(value)
                out[key] = parsed
        return out

    def _own(self, text: str | None) -> dict[str, Any] | None:
        if text is None:
            return None
        mine = self.own.get(text, _MISSING)
        if mine is _MISSING:
            mine = self.own[text] = _json_obj(text)
        return mine  # type: ignore[return-value]


def stored_runs(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], str]:
    """Every stored run-wide document by ``(source, run_id)``; none when the store predates ``judgment_runs``."""
    if not table_columns(con, "judgment_runs"):
        return {}
    return {(s, r): p for s, r, p in con.execute("SELECT source, run_id, parameters FROM judgment_runs").fetchall()}


def arrow_runs(runs: pa.Table | None) -> dict[tuple[str, str], str]:
    """The run-wide documents of an in-memory ``judgment_runs`` table (``ubi_pipeline.processors.labels.implicit.JudgmentRun.runs``)."""
    if runs is None or not runs.num_rows:
        return {}
    return dict(zip(zip(runs.column("source").to_pylist(), runs.column("run_id").to_pylist(), strict=True),
                    runs.column("parameters").to_pylist(), strict=True))


def merged_from_arrow(rows: pa.Table, runs: pa.Table | None) -> Iterator[dict[str, Any] | None]:
    """The parameters dict of every row of an in-memory ``judgments`` table, in order."""
    merge = ParameterMerger(arrow_runs(runs))
    has_run = "run_id" in rows.column_names
    for batch in rows.select(["source", "parameters", *(["run_id"] if has_run else [])]).to_batches(50_000):
        sources = batch.column("source").to_pylist()
        params = batch.column("parameters").to_pylist()
        ids = batch.column("run_id").to_pylist() if has_run else [None] * len(sources)
        for source, own, run in zip(sources, params, ids, strict=True):
            yield merge(source, run, own)


def read_judgments(con: duckdb.DuckDBPyConnection, columns: Sequence[str], *, where: str = "",
                   params: Sequence[Any] = (), order_by: str = "query, doc_id, source", share: bool = False
                   ) -> Iterator[tuple[Any, ...]]:
    """Stored judgment rows as ``(*columns, parameters dict)``; empty when the store has no ``judgments``.

    ``share``: rows with the same stored parameters share one dict object (:class:`ParameterMerger`); do not
    change the dicts then.

    ``columns`` are checked against ``ubi_pipeline.schemas.tables.JUDGMENT_COLUMNS`` and quoted; ``where`` and
    ``order_by`` are fixed SQL of the caller (never text from a request), ``params`` its values. Rows come in
    batches of 100,000 so a large store's rows are never all held as tuples at once.
    """

    have = table_columns(con, "judgments")
    if not have:
        return
    cols = checked_columns("judgments", [*columns, "source"] if "source" not in columns else list(columns))
    source_at = ([*columns, "source"] if "source" not in columns else list(columns)).index("source")
    merge = ParameterMerger(stored_runs(con), share=share)
    sql = (f"SELECT {cols}, {parameter_columns(split='run_id' in have)} FROM judgments"
           + (f" WHERE {where}" if where else "") + (f" ORDER BY {order_by}" if order_by else ""))
    cur = con.cursor()
    try:
        cur.execute(sql, list(params))
        n = len(columns)
        while batch := cur.fetchmany(100_000):
            for row in batch:
                yield (*row[:n], merge(row[source_at], *row[-5:]))
    finally:
        cur.close()
