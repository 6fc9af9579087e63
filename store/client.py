"""What readers and the derived-table writers call: open the store for reading, load a derived table.

Works the same whether the file is free (opened directly), held by a running collector or a DuckDB loader
(``ubi consume --db``: both advertise their admin URL in ``<db>.collector.json`` and serve the same admin
protocol, :mod:`ubi_pipeline.transport.admin`), or is a Parquet folder written by ``ubi consume --parquet``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ubi_pipeline.schemas.errors import StoreError, StoreLocked
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.store.answer_log import has_unapplied
from ubi_pipeline.store.duckdb_store import Store, is_lock_error
from ubi_pipeline.store.failed import failed_page
from ubi_pipeline.store.parquet_store import is_parquet_store, open_parquet_reader
from ubi_pipeline.store.sealed import Sealed, decode_seal, open_sealed


def sidecar_path(db: Path) -> Path:
    """Where a running collector (or DuckDB loader) advertises its URL for the database ``db``."""
    return Path(str(db) + ".collector.json")


def open_reader(db: Path | str, settings: Settings | None = None) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the store, or to its sealed segments when a collector holds the file.

    While a collector (or ``ubi consume --db``) holds the file, it is asked to seal what it stored since the
    last seal (:func:`request_seal`), and the connection is an in-memory DuckDB whose tables read those
    segments in place (:func:`ubi_pipeline.store.sealed.open_sealed`): no copy of the database is made for a reader, and
    nothing on disk is the reader's. That reader shares the machine with the writer, so it first steps back
    (:func:`yield_to_writer`: ``Settings.reader_nice``, ``Settings.reader_threads``). ``db`` may also be a
    Parquet folder written by ``ubi consume --parquet``: its tables are then views with the same dedup rules.
    Raises :class:`StoreError` when the file does not exist, or is locked and no collector answers.
    """
    path = Path(db)
    if is_parquet_store(path):
        return open_parquet_reader(path)
    if not path.exists():
        raise StoreError(f"{path}: no such database; ingest something first (`ubi serve`, `ubi import`)")
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.IOException as exc:
        if not is_lock_error(exc):
            raise StoreError(f"{path}: cannot open: {exc}") from exc
    else:
        if not has_unapplied(path):
            return con
        # The file is free, and a collector answered rows it did not commit before it stopped: a writer's open
        # writes them (ubi_pipeline.store.answer_log), then the reader opens the file again.
        con.close()
        try:
            Store(path).close()
        except StoreLocked:  # a writer took the file meanwhile, and wrote them as it opened: read through it
            pass
        else:
            return duckdb.connect(str(path), read_only=True)
    sealed = request_seal(path)
    threads = yield_to_writer(settings if settings is not None else Settings())
    try:
        return open_sealed(sealed, threads=threads)
    except duckdb.Error as exc:
        raise StoreError(f"{path}: cannot read the sealed segments under {sealed.root}: {exc}") from exc


def yield_to_writer(settings: Settings) -> int:
    """Step back for the writer on this machine before a reader scans its sealed segments; return DuckDB's threads.

    Lowers the calling thread's CPU priority to the nice value ``Settings.reader_nice`` unless it is that low
    already (``os.nice``; on Linux the nice value is per thread, and the DuckDB threads this thread starts next
    inherit it; it cannot be raised back without privileges, so it lasts for the rest of the reader, and a
    second read does not lower it further) and returns ``Settings.reader_threads``, by default one less than the
    cores (at least 1). On 2 cores a reader's DuckDB took both, beside the collector's event loop and writer
    thread: POST p99 during a read of a 20M-event store was 82.6 ms on the quiet machine (390 ms with two
    readers); the runs before and after are in README, "At 20M events".
    """
    try:
        now = os.nice(0)
        if settings.reader_nice > now:
            os.nice(settings.reader_nice - now)
    except OSError:  # a platform or sandbox that refuses: the read goes on at the same priority
        pass
    return settings.reader_threads or max(1, (os.cpu_count() or 1) - 1)


@contextmanager
def reading(db: Path | str, settings: Settings | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """:func:`open_reader` for the length of a block, closed afterwards (nothing is left to delete)."""
    con = open_reader(db, settings)
    try:
        yield con
    finally:
        con.close()


def advertised(db: Path) -> tuple[str, int | None] | None:
    """``(url, pid)`` from the sidecar a running collector writes beside ``db`` (:func:`advertise`); None when there
    is none or it cannot be read."""
    try:
        info = json.loads(sidecar_path(db).read_text())
        url, pid = info["url"], info.get("pid")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return (url, pid if isinstance(pid, int) else None) if isinstance(url, str) else None


def collector_url(db: Path) -> str:
    """URL of the collector that holds ``db``, from its sidecar file."""
    found = advertised(db)
    if found is None:
        raise StoreLocked(
            f"{db} is locked by another process and no running collector advertises it ({sidecar_path(db)} missing "
            "or unreadable). Stop the process holding the file, or run this command again once it has finished."
        )
    return found[0]


def request_seal(db: Path) -> Sealed:
    """Ask the collector holding ``db`` to seal what it stored since the last seal; return every segment."""
    import httpx  # here: 50 ms of start-up every command importing this module need not pay

    url = collector_url(db)
    try:
        # no read timeout: the first seal of a large store copies all of it (about 20 min for a 20M-event store on
        # a loaded 2-core machine) and is made once for every later reader; a collector that dies closes the socket
        resp = httpx.post(url + "/v1/admin/seal", timeout=httpx.Timeout(60.0, read=None))
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        raise StoreLocked(f"{db} is held by the collector at {url}, which did not seal it: {exc}") from exc
    return decode_seal(resp.content)


def load_derived(db: Path | str, name: str, data: pa.Table, *, replace_source: str | None = None) -> int:
    """Write a derived table into the store: directly when the file is free, else through the collector.

    ``replace_source`` replaces every stored row of that source (see :meth:`Store.load_table`).
    """
    return load_derived_tables(db, [(name, data, replace_source)])[0]


def load_derived_tables(db: Path | str, loads: Sequence[tuple[str, pa.Table, str | None]],
                        settings: Settings | None = None) -> list[int]:
    """Write derived tables, ``(table, rows, replace_source)`` in order: one transaction when the file is free
    (:meth:`Store.load_tables`, the writer opened with ``settings``: its memory limits, seal folder and wait),
    else one request to the collector per table, in the same order.

    Through the collector each table commits on its own; the order keeps every state a reader can see
    consistent (``judgment_runs`` before the ``judgments`` rows that refer to them, and the runs no row refers to
    any more deleted with the rows' replacement).
    """
    path = Path(db)
    try:
        with Store.from_settings(settings if settings is not None else Settings(), path) as store:
            return store.load_tables(loads)
    except StoreLocked:
        pass
    url = collector_url(path)
    return [_load_through(url, name, data, replace_source) for name, data, replace_source in loads]


def delete_derived(db: Path | str, name: str, keys: pa.Table) -> int:
    """Delete the rows of a derived table whose keys ``keys`` holds: directly when the file is free, else through
    the collector (``POST /v1/admin/delete/{table}``). Returns how many rows were deleted."""
    path = Path(db)
    try:
        with Store.from_settings(Settings(), path) as store:
            return store.delete_rows(name, keys)
    except StoreLocked:
        pass
    import httpx

    url = collector_url(path)
    try:
        resp = httpx.post(f"{url}/v1/admin/delete/{name}", content=_arrow_stream(keys),
                          headers={"content-type": "application/vnd.apache.arrow.stream"}, timeout=600)
        resp.raise_for_status()
        return int(resp.json()["deleted"])
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise StoreError(f"could not delete from {name} through the collector at {url}: {exc}") from exc


def _arrow_stream(data: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write_table(data)
    return bytes(sink.getvalue().to_pybytes())


def _load_through(url: str, name: str, data: pa.Table, replace_source: str | None) -> int:
    import httpx

    try:
        resp = httpx.post(
            f"{url}/v1/admin/load/{name}",
            params={"replace_source": replace_source} if replace_source is not None else None,
            content=_arrow_stream(data),
            headers={"content-type": "application/vnd.apache.arrow.stream"},
            timeout=600,
        )
        resp.raise_for_status()
        return int(resp.json()["rows"])
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise StoreError(f"could not load {name} through the collector at {url}: {exc}") from exc


def advertise(db: Path, url: str) -> Path:
    """Write the sidecar that tells readers where the collector holding ``db`` listens."""
    side = sidecar_path(db)
    side.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    return side


def failed_records(db: Path, *, limit: int, offset: int, kind: str | None) -> dict[str, Any]:
    """A page of failed records (:func:`ubi_pipeline.store.failed.failed_page`): from the file, or from the collector or
    loader that holds it."""
    if not db.exists():
        raise StoreError(f"{db}: no such database; ingest something first (`ubi serve`, `ubi import`)")
    try:
        store = Store(db, create=False)
    except StoreLocked:
        import httpx

        url = collector_url(db)
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if kind:
            params["kind"] = kind
        try:
            resp = httpx.get(url + "/v1/failed", params=params, timeout=60)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise StoreError(
                f"the process at {url} holding {db} did not list failed records: {exc}"
            ) from exc
        page: dict[str, Any] = resp.json()
        return page
    with store:
        return failed_page(store, limit=limit, offset=offset, kind=kind)
