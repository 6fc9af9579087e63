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
