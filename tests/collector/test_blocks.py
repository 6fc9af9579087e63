"""The block reader yields exactly the lines of ``stream_lines`` (numbers, stripping, blank lines), at any block size."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from ubi_pipeline.collector.blocks import block_lines
from ubi_pipeline.collector.bodies import stream_lines

#: Bytes that sit on every edge of a line: each whitespace bytes.strip() removes, other control bytes it keeps,
#: bytes that are not UTF-8, and line ends alone and doubled.
_PIECES = st.sampled_from([b"a", b"{", b" ", b"\t", b"\r", b"\n", b"\x0b", b"\x0c", b"\xff", b"\x00", b'"', b"\n\n",
                           b"\r\n", b"\x1c", b"\x85"])


def _blocked(data: bytes, block: int) -> list[tuple[int, bytes]]:
    return [(int(n), line) for numbers, lines in block_lines(io.BytesIO(data), block)
            for n, line in zip(numbers, lines.to_pylist(), strict=True)]


@settings(max_examples=300, deadline=None)
@given(data=st.lists(_PIECES, max_size=80).map(b"".join), block=st.sampled_from([1, 2, 3, 7, 64, 1 << 20]))
def test_block_lines_are_stream_lines(data: bytes, block: int) -> None:
    assert _blocked(data, block) == list(stream_lines(io.BytesIO(data)))


def test_lines_longer_than_a_block_and_many_blank_ones() -> None:
    long = b"x" * 1000
    data = b"\n\n  \n" + long + b"\r\n" + b" \t" * 20 + b"y" + b" " * 30 + b"\n\n" + long
    # hand count: lines 4 (the long one, CR stripped), 5 (y, 40 + 30 bytes of whitespace stripped), 7 (no end)
    assert _blocked(data, 16) == [(4, long), (5, b"y"), (7, long)]
    assert _blocked(data, 16) == list(stream_lines(io.BytesIO(data)))


def test_a_line_longer_than_any_record_is_refused_by_its_number_on_both_paths(tmp_path) -> None:
    # issue 25: a 1 MB gzip file holding one 1 GB line ended `ubi import` in MemoryError (the line was held whole).
    # Now a line over MAX_LINE_BYTES is refused by its number before it is held, on the fast and the exact path,
    # and the records before it are stored.
    import gzip

    import pytest

    from ubi_pipeline.collector.bodies import MAX_LINE_BYTES
    from ubi_pipeline.collector.importer import import_files
    from ubi_pipeline.schemas.errors import InputFileError
    from ubi_pipeline.store.duckdb_store import Store

    good = b'{"event_id":"e%d","action_name":"click","timestamp":"2024-05-16T12:34:56.789Z"}\n'
    path = tmp_path / "huge.ndjson.gz"
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(good % 1 + good % 2)
        fh.write(b'{"event_id":"' + b"x" * (MAX_LINE_BYTES + 10) + b'"}\n')  # line 3
        fh.write(good % 4)
    assert path.stat().st_size < MAX_LINE_BYTES // 100  # it compresses to almost nothing
    for fast in (True, False):
        db = tmp_path / f"{fast}.duckdb"
        with pytest.raises(InputFileError, match=r"huge\.ndjson\.gz:3: the line is longer than 16,777,216 bytes"):
            import_files([path], db, fast=fast)
        # nothing after the long line was taken, and what was read before it with it in one chunk was not
        # committed (a chunk is written whole); the repaired file then imports every record once
        repaired = tmp_path / f"repaired-{fast}.ndjson"
        repaired.write_bytes(good % 1 + good % 2 + good % 4)
        import_files([repaired], db, fast=fast)
        with Store(db) as store:
            assert store.read("SELECT event_id FROM ubi_events ORDER BY event_id") == [("e1",), ("e2",), ("e4",)]
