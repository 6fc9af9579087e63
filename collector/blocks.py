"""Lines of a file in Arrow blocks: what :func:`ubi_pipeline.collector.bodies.stream_lines` yields, without Python per line.

``ubi import``'s fast path reads NDJSON and ``_bulk`` files a block of bytes at a time (:data:`LINE_BLOCK`),
finds the line ends with numpy and hands the lines on as one Arrow binary array per block, with their
1-based numbers. The lines are exactly :func:`stream_lines`'s: split at ``\\n`` only, stripped of ASCII
whitespace at both ends (what ``bytes.strip()`` removes), blank ones left out but counted
(``tests/collector/test_blocks.py`` compares the two on edge cases). A line longer than a block is carried
on to the next one whole, so memory is a block plus the longest line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from ubi_pipeline.collector.bodies import MAX_LINE_BYTES, line_too_long

#: Bytes read at a time (a few thousand lines of a typical export).
LINE_BLOCK = 8 << 20
#: ``bytes.strip()``'s whitespace: space, \t, \n, \v, \f, \r.
_WS = np.zeros(256, dtype=bool)
_WS[[9, 10, 11, 12, 13, 32]] = True
#: Whitespace bytes trimmed per end with numpy before a line is stripped in Python (CRLF needs one).
_TRIM_ROUNDS = 4


def block_lines(fh: BinaryIO, block: int | None = None,
                max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[np.ndarray, pa.Array]]:
    """``(numbers, lines)`` per block of ``fh`` from where it stands: the non-blank stripped lines (binary)
    and their 1-based line numbers (int64), as :func:`ubi_pipeline.collector.bodies.stream_lines` numbers them.
    ``block``: bytes read at a time (default :data:`LINE_BLOCK`); a line over ``max_line`` bytes raises
    :func:`ubi_pipeline.collector.bodies.line_too_long` before it is held whole."""
    block = block or LINE_BLOCK
    before = 0  # lines in the blocks already handed on
    carry: list[bytes] = []  # the start of a line that did not end in the blocks read
    carried = 0
    while True:
        data = fh.read(block)
        if not data:
            break
        end = data.rfind(b"\n")
        if end < 0:
            carry.append(data)
            carried += len(data)
            if carried > max_line:
                raise line_too_long(before + 1, max_line)
            continue
        if carry and carried + end > max_line:  # the carried line ends in this block, past the limit
            raise line_too_long(before + 1, max_line)
        body = b"".join([*carry, data[: end + 1]]) if carry else data[: end + 1]
        carry = [data[end + 1:]] if end + 1 < len(data) else []
        carried = len(carry[0]) if carry else 0
        numbers, lines, count = _lines(body, before, final=False)
        before += count
        if len(lines):
            yield numbers, lines
    if carry:
        numbers, lines, _ = _lines(b"".join(carry), before, final=True)
        if len(lines):
            yield numbers, lines


def _lines(body: bytes, before: int, *, final: bool) -> tuple[np.ndarray, pa.Array, int]:
    """The lines of ``body`` (every one ending in ``\\n``, or, ``final``, the last without one)."""
    raw = np.frombuffer(body, dtype=np.uint8)
    ends = np.flatnonzero(raw == 10)
    if final:
        ends = np.append(ends, len(body))
    starts = np.empty(len(ends), dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    ends = ends.astype(np.int64)
    numbers = np.arange(before + 1, before + 1 + len(ends), dtype=np.int64)
    # Strip: a few rounds in numpy over the lines that still start or end with whitespace, then Python
    # (bytes.strip) for any that are left; most lines need neither.
    for _ in range(_TRIM_ROUNDS):
        open_ = ends > starts
        lead = open_ & _WS[raw[np.minimum(starts, len(raw) - 1)]]
        starts[lead] += 1
        open_ = ends > starts
        trail = open_ & _WS[raw[np.maximum(ends - 1, 0)]]
        ends[trail] -= 1
        if not lead.any() and not trail.any():
            break
    else:
        open_ = ends > starts
        left = np.flatnonzero(open_ & (_WS[raw[np.minimum(starts, len(raw) - 1)]]
                                       | _WS[raw[np.maximum(ends - 1, 0)]]))
        for i in left.tolist():
            line = body[starts[i]:ends[i]]
            stripped = line.strip()
            starts[i] += len(line) - len(line.lstrip())
            ends[i] = starts[i] + len(stripped)
    keep = ends > starts
    if not keep.all():
        starts, ends, numbers = starts[keep], ends[keep], numbers[keep]
    n = len(starts)
    if not n:
        return numbers, pa.array([], pa.large_binary()), len(keep)
    # Lines and the gaps between them as one array (offsets s0, e0, s1, e1, ...), then every other element:
    # one copy of the bytes, in C.
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2] = starts
    bounds[1::2] = ends
    both = pa.Array.from_buffers(pa.large_binary(), 2 * n - 1, [None, pa.py_buffer(bounds), pa.py_buffer(body)])
    lines = both.take(pa.array(np.arange(0, 2 * n - 1, 2, dtype=np.int64)))
    return numbers, lines, len(keep)
