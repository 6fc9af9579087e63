"""``ubi import`` of OpenSearch ``_bulk`` files: the line each error names is the document's own line."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from ubi_pipeline.collector import importer
from ubi_pipeline.collector.importer import import_files


def test_bulk_error_lines_come_from_parse_bulk_after_a_one_line_delete(tmp_path: Path) -> None:
    """A ``delete`` action has no document line, so pairing lines two by two (``numbers[1::2]``) named the
    wrong line for every error after it. The lines below are counted by hand from the file."""
    body = "\n".join([
        '{"index": {"_index": "ubi_events", "_id": "e1"}}',  # line 1
        '{"action_name": "click", "timestamp": "2024-05-16T12:00:00Z"}',  # line 2: record 0, stored
        '{"delete": {"_index": "ubi_events", "_id": "x"}}',  # line 3: record 1, refused, no document
        '{"index": {"_index": "ubi_events", "_id": "e2"}}',  # line 4
        '{"action_name": "click"}',  # line 5: record 2, no timestamp
        '{"index": {"_index": "ubi_events"}}',  # line 6
        '{"action_name": "click", "timestamp": "not a time"}',  # line 7: record 3, bad timestamp
    ]) + "\n"
    path = tmp_path / "export.ndjson"
    path.write_text(body)
    (report,), mode = import_files([path], tmp_path / "s.duckdb")
    assert mode == "direct"
    assert (report.counts.events, report.rejected) == (1, 3)
    assert [(index, line, field) for index, line, field, _ in report.errors] == [
        (1, 3, "action"),
        (2, 5, "timestamp"),
        (3, 7, "timestamp"),
    ]


def test_a_file_imported_twice_reports_its_counts_by_kind(tmp_path: Path) -> None:
    """FileReport keeps one ubi_pipeline.store.rows.Counts: the second import of a file of one query record and two events
    (counted by hand) finds all three stored, and the counts say which kind each duplicate was."""
    from ubi_pipeline.store.rows import Counts

    path = tmp_path / "log.ndjson"
    path.write_text("\n".join([
        '{"query_id": "q1", "user_query": "shoes"}',
        '{"action_name": "click", "query_id": "q1", "timestamp": "2024-05-16T12:00:00Z"}',
        '{"action_name": "impression", "query_id": "q1", "timestamp": "2024-05-16T12:00:01Z"}',
    ]) + "\n")
    (first,), _ = import_files([path], tmp_path / "s.duckdb")
    (second,), _ = import_files([path], tmp_path / "s.duckdb")
    assert first.counts == Counts(queries=1, events=2)
    assert second.counts == Counts(query_duplicates=1, event_duplicates=2)
    assert (second.counts.accepted, second.counts.duplicates, second.rejected) == (0, 3, 0)
    assert second.public()["accepted"] == 0 and second.public()["duplicates"] == 3


def _import_within_a_minute(paths: list[Path], db: Path, **options: Any) -> BaseException | None:
    """What ``import_files`` raised (None: nothing), run in a thread that must end within 60 s: a hang fails the
    test instead of stalling the whole run."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            import_files(paths, db, **options)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 (returned to the test)
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "import_files hung after a failed chunk"
    return outcome[0]


def _events_file(path: Path, n: int) -> Path:
    path.write_text("".join(
        f'{{"action_name": "click", "query_id": "q{i}", "timestamp": "2024-01-01T00:00:00Z"}}\n' for i in range(n)))
    return path


@pytest.mark.parametrize("chunks", [1, 3])  # the failing chunk the file's last (it was outside the rollback), or not
def test_a_failure_while_writing_a_chunk_rolls_back_and_releases_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunks: int
) -> None:
    # A chunk whose parse fails (a bug, or DuckDB refusing a statement): the import raises, nothing of the open
    # transaction is stored, and the store closes. Before, a failure in a file's last chunk left the transaction
    # open, holding the store lock, and Store.close waited for ever (CI hung in test_import_stream.py).
    from ubi_pipeline.collector import fastpath

    chunked = importer.fast_chunks
    monkeypatch.setattr(importer, "fast_chunks",
                        lambda path, kind=None, cursor=None: chunked(path, kind, cursor, size=1000))

    def fail(*args: object, **kwargs: object) -> None:
        raise duckdb.CatalogException("Catalog Error: made to fail by the test")

    monkeypatch.setattr(fastpath, "general_parse", fail)
    path = _events_file(tmp_path / "e.ndjson", 1000 * chunks)
    db = tmp_path / "s.duckdb"
    assert isinstance(_import_within_a_minute([path], db), duckdb.CatalogException)
    with duckdb.connect(str(db), read_only=True) as con:  # closed: a read-only open succeeds
        assert con.execute("SELECT count(*) FROM ubi_events").fetchall() == [(0,)]


def _cut_gzip(tmp_path: Path, lines: int) -> Path:
    """An NDJSON file of ``lines`` events, gzipped and cut in half (an interrupted copy)."""
    import gzip

    whole = gzip.compress(_events_file(tmp_path / "e.ndjson", lines).read_bytes())
    cut = tmp_path / "e.ndjson.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    return cut


@pytest.fixture
def small_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 1,000 records read 64 kB at a time, so that a small file has chunks before its cut."""
    from ubi_pipeline.collector import blocks

    chunked = importer.fast_chunks
    monkeypatch.setattr(importer, "fast_chunks",
                        lambda path, kind=None, cursor=None: chunked(path, kind, cursor, size=1000))
    monkeypatch.setattr(blocks, "LINE_BLOCK", 64 << 10)


@pytest.mark.parametrize("fast", [True, False])
def test_a_gzip_file_cut_short_is_an_input_error_naming_it(tmp_path: Path, small_reads: None, fast: bool) -> None:
    # an interrupted download: gzip raises EOFError half-way, which used to end `ubi import` as an internal error
    from ubi_pipeline.schemas.errors import InputFileError

    cut = _cut_gzip(tmp_path, 30_000)
    db = tmp_path / "s.duckdb"
    with pytest.raises(InputFileError, match=r"e\.ndjson\.gz: the gzip data ends early, after .* bytes: the file is cut short"):
        import_files([cut], db, fast=fast)
    with duckdb.connect(str(db), read_only=True) as con:  # what was read before the cut is stored, once
        stored, distinct = con.execute("SELECT count(*), count(DISTINCT query_id) FROM ubi_events").fetchall()[0]
    assert 0 < stored < 30_000 and stored == distinct


def test_a_failure_writing_what_was_read_before_a_cut_also_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_reads: None
) -> None:
    # the chunks read before the cut are written before the InputFileError is raised; if that write fails
    # too, its transaction is rolled back and the store released all the same
    from ubi_pipeline.schemas.errors import InputFileError

    cut = _cut_gzip(tmp_path, 30_000)
    ended: list[InputFileError] = []  # set once reading the file raised: only the writes after it fail
    reading, storing = importer.fast_chunks, importer.store_chunk

    def read(*args: object, **kwargs: object) -> Iterator[object]:
        try:
            yield from reading(*args, **kwargs)
        except InputFileError as exc:
            ended.append(exc)
            raise

    def store(*args: object, **kwargs: object) -> object:
        if ended:
            raise duckdb.CatalogException("Catalog Error: made to fail by the test")
        return storing(*args, **kwargs)

    monkeypatch.setattr(importer, "fast_chunks", read)
    monkeypatch.setattr(importer, "store_chunk", store)
    outcome = _import_within_a_minute([cut], tmp_path / "t.duckdb", batch_records=2000)  # a commit every 2 chunks
    assert ended and isinstance(outcome, duckdb.CatalogException)
    with duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True) as con:  # the store was released
        stored = con.execute("SELECT count(*) FROM ubi_events").fetchall()[0][0]
    assert 0 < stored < 30_000  # the transactions committed before the cut stay; the failed one left nothing
