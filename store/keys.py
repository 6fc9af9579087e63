"""Unique ``event_key`` / ``query_key`` without an index in memory: key tables of 64-bit hashes on disk.

A DuckDB PRIMARY KEY keeps its ART index in memory whole and cannot evict it: about 125 bytes per stored
event for the ``event_key`` strings (40 for a UBIGINT key), so a writer's memory grew with the store and a
``memory_limit`` made a long import fail ("failed to pin block"). Here ``ubi_events`` and ``ubi_queries``
have no index. Beside each is a key table (``ubi_pipeline.schemas.tables.EVENT_KEY_TABLE``): one row per stored row,
``md5_number_lower(key)`` and the stored row's ``rowid``. It lives in DuckDB's buffer pool like any table, so
``memory_limit`` bounds it. A write of :data:`KEY_FLUSH_ROWS` rows or more (a file chunk) writes its key rows in
its own transaction; smaller writes (HTTP requests) hold theirs in memory, where lookups search them too, until
that many are held or the store closes, then one INSERT writes them. Key rows lost with the process are written
from the stored rows on the next open, as for rows written around the store.

A write looks its keys up in two steps:

1. a Bloom filter of every stored key hash, in this process (:class:`KeyFilter`, 2-4 bytes per stored row, at
   most :data:`MAX_FILTER_BYTES`), says which keys are surely new: those need no lookup at all;
2. the others (retries, re-run imports, conflicts, and 0.2-0.4 % false positives) are joined with the key
   table, and every hash hit is checked against the stored row's key string (fetched by ``rowid``), so two
   keys that share a hash are both stored: a hash collision never drops a record. Which part of the key table
   is read is decided by a second set of Bloom filters, one per block of :data:`BLOCK_ROWS` rowids
   (:class:`BlockFilters`): only the blocks whose filter may hold the key are scanned, each pruned by DuckDB's
   zone maps on ``row_id`` (key rows are appended in ``row_id`` order, so a block is a row group or two). A
   retry at 20M events read the whole key table, about 0.2 s of CPU, growing with the store; it now reads the
   block that holds its key plus the blocks that say "maybe" falsely (0.4 % of them), see README, "At 20M
   events". A batch whose keys point at most blocks (a whole import re-run) still scans the table once.

The rows a transaction appends get ``rowid`` s from the count of rows before it (the table is append-only,
and DuckDB numbers appended rows in insertion order and gives a rolled-back append's numbers to the next
one; tests/store/test_keys.py). Rows appended without key rows (``bulk_log`` and tests write tables
directly) get them on open (:meth:`KeyIndex.open`) or at the next write (:meth:`KeyIndex.sync`); on open the
last key rows are also checked against their stored rows, and the key table is rebuilt if they differ.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from ubi_pipeline.schemas import tables
from ubi_pipeline.schemas.errors import StoreError
from ubi_pipeline.store.sql import quote_ident

#: Bits of filter per stored key and bits set per key (one 64-bit word per key: a blocked Bloom filter).
BITS_PER_KEY = 16
BITS_SET = 6
#: The filter stops growing here (64 MB: 33M keys at 16 bits); past it, it holds more keys per bit and says
#: "maybe" more often, which costs lookups, never correctness.
MAX_FILTER_BYTES = 64 * 1024 * 1024
_MIN_WORDS = 1 << 14
#: Key rows checked against their stored rows on open (the last ones written).
_CHECK_ON_OPEN = 1000
#: Key rows of small writes held in memory (and searched there) before one INSERT writes them to the key
#: table (:meth:`KeyIndex._flush`); a write of this many rows or more writes its key rows at once.
KEY_FLUSH_ROWS = 8192


class KeyFilter:
    """A blocked Bloom filter of 64-bit hashes: no false negatives, 0.4 % false positives at
    :data:`BITS_PER_KEY` bits a key (measured, tests/store/test_keys.py; Putze, Sanders, Singler, "Cache-,
    hash- and space-efficient Bloom filters", 2007).

    Each hash picks one 64-bit word by its low bits and sets :data:`BITS_SET` bits in it chosen by bits 24-59,
    so ``words`` is at most 2^23 long and the two never overlap.
    """

    def __init__(self, capacity: int) -> None:
        want = max(_MIN_WORDS, capacity * BITS_PER_KEY // 64)
        words = 1 << int(np.ceil(np.log2(want)))
        self.words = np.zeros(min(words, MAX_FILTER_BYTES // 8), dtype=np.uint64)
        self.count = 0

    @property
    def capacity(self) -> int:
        """Keys it holds at :data:`BITS_PER_KEY` (it takes more, with more false positives)."""
        return len(self.words) * 64 // BITS_PER_KEY

    @property
    def full(self) -> bool:
        """Past its capacity while it could still grow."""
        return self.count > self.capacity and len(self.words) * 8 < MAX_FILTER_BYTES

    def _locate(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = hashes.astype(np.uint64, copy=False)
        idx = (h & np.uint64(len(self.words) - 1)).astype(np.intp)
        mask = np.zeros(len(h), dtype=np.uint64)
        for i in range(BITS_SET):
            mask |= np.uint64(1) << ((h >> np.uint64(24 + 6 * i)) & np.uint64(63))
        return idx, mask

    def add(self, hashes: np.ndarray) -> None:
        idx, mask = self._locate(hashes)
        np.bitwise_or.at(self.words, idx, mask)
        self.count += len(hashes)

    def might_contain(self, hashes: np.ndarray) -> np.ndarray:
        """Per hash: False when it was surely never added, True when it may have been."""
        idx, mask = self._locate(hashes)
        return np.asarray((self.words[idx] & mask) == mask)


#: Rowids per block of :class:`BlockFilters`: DuckDB's row group (122,880 rows), the unit its zone maps prune.
BLOCK_ROWS = 122_880
#: Words of one block's filter: :data:`BITS_PER_KEY` bits for each of its rows, rounded up to a power of two
#: (2^15 words, 256 KB a block: 2.1 bytes a stored key).
_BLOCK_WORDS = 1 << int(np.ceil(np.log2(BLOCK_ROWS * BITS_PER_KEY / 64)))
#: A lookup reads the candidate blocks one range at a time while they are at most this share of all blocks;
#: past it, one scan of the whole key table is cheaper.
_MAX_BLOCK_SHARE = 0.25
_MIX = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's multiplier: the block filters use other hash bits
_GATHER = 1024  # hashes looked up in every block at once
#: The block filters stop here (128 MB: 512 blocks, 62.9M rowids); blocks past it have no filter and are read by
#: every lookup, so past that many stored keys a lookup costs more again, never correctness.
MAX_BLOCK_FILTER_BYTES = 128 * 1024 * 1024


class BlockFilters:
    """One blocked Bloom filter (as :class:`KeyFilter`) per block of :data:`BLOCK_ROWS` rowids: which blocks of
    the key table may hold a hash. No false negatives: every key row committed is added to its block's filter.

    All blocks have the same size, so a hash picks the same word and bits in each, and one gather over the
    blocks answers for all of them. Memory: 256 KB a block, 2.1 bytes a stored key (41 MB at 20M keys), at most
    :data:`MAX_BLOCK_FILTER_BYTES`: the blocks past it have no filter and are candidates for every hash.
    """

    def __init__(self, rows: int = 0) -> None:
        """Room for the blocks of ``rows`` rowids to start with."""
        self.limit = max(1, MAX_BLOCK_FILTER_BYTES // (_BLOCK_WORDS * 8))  # blocks that get a filter
        self.words = np.zeros((min(self.limit, -(-rows // BLOCK_ROWS)), _BLOCK_WORDS), dtype=np.uint64)
        self.blocks = 0  # blocks in use (the filtered ones are rows of ``words``, grown by a quarter when full)

    @property
    def nbytes(self) -> int:
        """Bytes held (the blocks in use and the room to grow)."""
        return int(self.words.nbytes)

    @staticmethod
    def _locate(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = (hashes.astype(np.uint64, copy=False) ^ (hashes.astype(np.uint64, copy=False) >> np.uint64(31))) * _MIX
        idx = (h & np.uint64(_BLOCK_WORDS - 1)).astype(np.intp)
        mask = np.zeros(len(h), dtype=np.uint64)
        for i in range(BITS_SET):
            mask |= np.uint64(1) << ((h >> np.uint64(24 + 6 * i)) & np.uint64(63))
        return idx, mask

    def add(self, hashes: np.ndarray, row_ids: np.ndarray) -> None:
        """Add each hash to the filter of the block of its ``row_id``."""
        if not len(hashes):
            return
        block = (np.asarray(row_ids, dtype=np.int64) // BLOCK_ROWS).astype(np.intp)
        self.blocks = max(self.blocks, int(block.max()) + 1)
        need = min(self.blocks, self.limit)
        if need > len(self.words):
            rows = min(self.limit, max(need, len(self.words) + len(self.words) // 4 + 1))
            grown = np.zeros((rows, _BLOCK_WORDS), dtype=np.uint64)
            grown[: len(self.words)] = self.words
            self.words = grown
        kept = block < self.limit
        if not kept.all():
            block, hashes = block[kept], hashes[kept]
        idx, mask = self._locate(hashes)
        np.bitwise_or.at(self.words, (block, idx), mask)

    def candidates(self, hashes: np.ndarray, most: int | None = None) -> np.ndarray | None:
        """The blocks (sorted) whose filter may hold at least one of ``hashes``; None once more than ``most``."""
        filtered = min(self.blocks, self.limit)
        found = np.zeros(self.blocks, dtype=bool)
        found[filtered:] = len(hashes) > 0  # blocks without a filter may hold anything
        if most is not None and int(found.sum()) > most:
            return None
        for start in range(0, len(hashes), _GATHER):  # a (blocks, hashes) gather at a time: 1.3 MB at 163 blocks
            idx, mask = self._locate(hashes[start:start + _GATHER])
            found[:filtered] |= ((self.words[:filtered, idx] & mask) == mask).any(axis=1)
            if most is not None and int(found.sum()) > most:
                return None
        return np.flatnonzero(found)


def block_ranges(blocks: np.ndarray) -> list[tuple[int, int]]:
    """Sorted block numbers as ``[low, high)`` row_id ranges, neighbouring blocks merged."""
    ranges: list[tuple[int, int]] = []
    for b in blocks.tolist():
        low, high = b * BLOCK_ROWS, (b + 1) * BLOCK_ROWS
        if ranges and ranges[-1][1] == low:
            ranges[-1] = (ranges[-1][0], high)
        else:
            ranges.append((low, high))
    return ranges


class KeyIndex:
    """The key table of one keyed table (``ubi_events`` or ``ubi_queries``) and its filter; used by
    :class:`ubi_pipeline.store.duckdb_store.Store` under its write lock."""

    def __init__(self, table: tables.Table) -> None:
        if table.key_table is None or len(table.key) != 1:
            raise StoreError(f"table {table.name} is not kept unique by a key table")
        self.table = quote_ident(table.name)
        self.key = quote_ident(table.key[0])
        self._key_name = table.key[0]
        self.keys = quote_ident(table.key_table)
        self.rows = 0  # rows committed in the table that have key rows: the rowid of the next row appended
        self._top = 0  # the same within the open transaction: rows with key rows, its own appends included
        self._base = 0  # the rowid of this write's first row (set by sync)
        # Rows appended in the open transaction, (first rowid, rows): DuckDB numbers a transaction's own rows
        # apart until it commits, so a later write of the same transaction (Store.batch) finds them here.
        self._local: list[tuple[int, pa.Table]] = []
        self.filter: KeyFilter | None = None  # filled from the key table at the first write
        #: Whether rows may have been committed around this index (:meth:`Store.transaction`, a raw write)
        #: since :meth:`sync` last counted them: only then does :meth:`sync` count the table.
        self.stale = True
        # Key rows not yet in the key table, (hashes, row_ids) arrays: of committed rows (_pending) and of this
        # transaction's (_txn). Small writes leave theirs here and the key table gets them KEY_FLUSH_ROWS at a
        # time (:meth:`_flush`): one INSERT was 1.0 ms of a 6 ms single-event group commit. Rows whose key rows
        # were never written (a crash) get them on open, as rows written around the store do.
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._txn: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_flushed = False  # _pending went into the key table in the open transaction
        self.blocks = BlockFilters()  # filled with the filter

    def open(self, con: duckdb.DuckDBPyConnection) -> None:
        """Bring the key table up to the stored rows (or rebuild it), then fill the filter."""
        (rows,) = _one(con, f"SELECT count(*) FROM {self.table}")
        (keyed, top) = _one(con, f"SELECT count(*), coalesce(max(row_id), -1) FROM {self.keys}")
        if keyed != top + 1 or keyed > rows or not self._tail_matches(con):
            con.execute(f"DELETE FROM {self.keys}")
            keyed = 0
        if keyed < rows:
            con.execute(f"INSERT INTO {self.keys} SELECT md5_number_lower({self.key}), rowid FROM {self.table} "
                        f"WHERE rowid >= {int(keyed)}")
        self.rows = self._top = int(rows)
        self.stale = True
        self._pending, self._txn, self._pending_flushed = [], [], False
        # The filter is filled at the first write (:meth:`sync`), not here: opening stays a few statements, so
        # a collector or loader advertises itself as soon as it holds the file (readers look for it then).
        self.filter = None

    def _tail_matches(self, con: duckdb.DuckDBPyConnection) -> bool:
        (bad,) = _one(con, f"""
            SELECT count(*) FROM (SELECT * FROM {self.keys} ORDER BY row_id DESC LIMIT {_CHECK_ON_OPEN}) k
            LEFT JOIN {self.table} t ON t.rowid = k.row_id
            WHERE t.{self.key} IS NULL OR md5_number_lower(t.{self.key}) <> k.key_hash""")
        return int(bad) == 0

    def refill(self, con: duckdb.DuckDBPyConnection) -> None:
        """A new filter sized for the stored keys (twice their number), filled from the key table."""
        (count,) = _one(con, f"SELECT count(*) FROM {self.keys}")
        pending = [] if self._pending_flushed else self._pending
        count += sum(len(h) for h, _ in pending)
        fresh, blocks = KeyFilter(2 * int(count)), BlockFilters(int(count))
        reader = con.sql(f"SELECT key_hash, row_id FROM {self.keys}").to_arrow_reader(1 << 20)
        for batch in reader:
            hashes = batch.column(0).to_numpy()
            fresh.add(hashes)
            blocks.add(hashes, batch.column(1).to_numpy())
        for hashes, row_ids in pending:
            fresh.add(hashes)
            blocks.add(hashes, row_ids)
        self.filter, self.blocks = fresh, blocks

    def hashes(self, keys: Sequence[str]) -> np.ndarray:
        """:func:`key_hashes` of ``keys``."""
        return key_hashes(keys)

    def lookup(
        self, cur: duckdb.DuckDBPyConnection, keys: Sequence[str], hashes: np.ndarray, columns: Sequence[str]
    ) -> dict[int, tuple[Any, ...]]:
        """For each position of ``keys`` stored already: the stored row's ``columns`` (declared names)."""
        maybe = np.flatnonzero(self._filter().might_contain(hashes))
        if not len(maybe):
            return {}
        found = self._unwritten(hashes[maybe])
        blocks = self.blocks.candidates(hashes[maybe], most=max(1, int(_MAX_BLOCK_SHARE * self.blocks.blocks)))
        if blocks is not None and not len(blocks):
            hits: list[int] = []
        else:
            _ubi_probe = pa.table({"h": pa.array(hashes[maybe], pa.uint64())})  # noqa: F841 (replacement scan)
            probe = f"SELECT k.row_id FROM {self.keys} k SEMI JOIN _ubi_probe p ON k.key_hash = p.h"
            if blocks is not None:  # else: most blocks may hold one of the keys, and one scan is cheaper
                # one range per run of neighbouring blocks; ints only in the SQL (row_id bounds)
                probe = " UNION ALL ".join(f"{probe} WHERE k.row_id >= {int(lo)} AND k.row_id < {int(hi)}"
                                           for lo, hi in block_ranges(blocks))
            hits = [r for (r,) in cur.execute(f"SELECT DISTINCT row_id FROM ({probe})").fetchall()]
        hits = sorted(set(hits).union(found))
        if not hits:
            return {}
        cols = ", ".join(quote_ident(c) for c in columns)
        first_local = self._local[0][0] if self._local else None  # rows from here on: this transaction's
        table_rows = [r for r in hits if first_local is None or r < first_local]
        stored = {
            row[0]: row[1:]
            for row in cur.execute(
                f"SELECT {self.key}, {cols} FROM {self.table} WHERE rowid IN (SELECT unnest(?))", [table_rows]
            ).fetchall()
        } if table_rows else {}
        if first_local is not None:
            stored.update(self._local_rows([r for r in hits if r >= first_local], columns))
        # The exact key decides: a hash hit whose stored key differs is another key (a collision), not stored.
        return {int(p): stored[keys[int(p)]] for p in maybe if keys[int(p)] in stored}

    def begin(self) -> None:
        """A write transaction starts: what it sees is what was committed (a transaction rolled back before
        it left nothing)."""
        self._top = self.rows
        self._local = []
        self._txn, self._pending_flushed = [], False

    def _unwritten(self, probe: np.ndarray) -> list[int]:
        """Row ids of the key rows not yet in the key table whose hash is in ``probe``."""
        held = [*self._pending, *self._txn]
        if not held:
            return []
        hashes = np.concatenate([h for h, _ in held])
        row_ids = np.concatenate([r for _, r in held])
        return [int(r) for r in row_ids[np.isin(hashes, probe)]]

    def _flush(self, cur: duckdb.DuckDBPyConnection) -> None:
        """The key rows held in memory into the key table, in row_id order, in the open transaction."""
        held = [*([] if self._pending_flushed else self._pending), *self._txn]
        if held:
            _ubi_new_keys = pa.table({  # noqa: F841 (read by name by DuckDB's replacement scan)
                "key_hash": pa.array(np.concatenate([h for h, _ in held]), pa.uint64()),
                "row_id": pa.array(np.concatenate([r for _, r in held]), pa.int64()),
            })
            cur.execute(f"INSERT INTO {self.keys} SELECT key_hash, row_id FROM _ubi_new_keys")
        self._pending_flushed, self._txn = True, []

    def write_held(self, con: duckdb.DuckDBPyConnection) -> None:
        """Before the store closes: the key rows held in memory into the key table, in a transaction of their
        own (if this fails or never runs, the next :meth:`open` writes them from the stored rows)."""
        if not self._pending:
            return
        con.execute("BEGIN TRANSACTION")
        try:
            self._flush(con)
            con.execute("COMMIT")
        except duckdb.Error:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            self._pending_flushed = False
            raise
        self._pending, self._pending_flushed = [], False

    def _local_rows(self, row_ids: Sequence[int], columns: Sequence[str]) -> dict[str, tuple[Any, ...]]:
        """By key, the ``columns`` of rows this transaction appended (``row_ids`` from its key rows)."""
        out: dict[str, tuple[Any, ...]] = {}
        for base, rows in self._local:
            mine = [r - base for r in row_ids if base <= r < base + rows.num_rows]
            if mine:
                part = rows.select([self._key_name, *columns]).take(pa.array(mine, pa.int64())).to_pydict()
                for values in zip(*part.values(), strict=True):
                    out[values[0]] = tuple(values[1:])
        return out

    def sync(self, cur: duckdb.DuckDBPyConnection) -> None:
        """At the start of a write: key rows (and filter bits) for rows committed around this index (a raw
        ``INSERT`` through :meth:`Store.transaction`), so that they are found; call before :meth:`lookup`.
        Several writes may share one transaction (:meth:`Store.batch`): the rows the earlier ones appended
        have their key rows already (``_top``)."""
        if self.filter is None:
            self.refill(cur)
        if not self.stale:
            # Only this store writes the file, and every write but a raw one comes through here: nothing was
            # committed around the index (a count(*) per write was 0.7 ms of a 6 ms single-event commit).
            self._base = self._top
            return
        (count,) = _one(cur, f"SELECT count(*) FROM {self.table}")
        if count > self._top:
            self._flush(cur)  # the key rows held in memory first: key rows stay in row_id order
            added = cur.execute(
                f"INSERT INTO {self.keys} SELECT md5_number_lower({self.key}), rowid FROM {self.table} "
                f"WHERE rowid >= {int(self._top)} RETURNING key_hash, row_id").fetchall()
            # Before the commit: if it fails, the filters say "maybe" for keys they need not, never the reverse.
            hashes = np.array([h for h, _ in added], dtype=np.uint64)
            self._filter().add(hashes)
            self.blocks.add(hashes, np.array([r for _, r in added], dtype=np.int64))
        self._base = self._top = int(count)

    def append(self, cur: duckdb.DuckDBPyConnection, hashes: np.ndarray, rows: pa.Table) -> None:
        """Key rows for ``rows``, just appended in this transaction (``hashes``: their keys'), in order (after
        :meth:`sync`), and their hashes in the filter at once, so that a later write of the same transaction
        finds them (if the transaction rolls back, the filter says "maybe" for keys it need not, never the
        reverse). Call :meth:`committed` once the transaction committed."""
        row_ids = np.arange(self._base, self._base + len(hashes), dtype=np.int64)
        self._txn.append((np.asarray(hashes, dtype=np.uint64), row_ids))
        held = sum(len(h) for h, _ in self._txn)
        if not self._pending_flushed:
            held += sum(len(h) for h, _ in self._pending)
        if held >= KEY_FLUSH_ROWS:
            self._flush(cur)
        self._local.append((self._base, rows))
        self._top = self._base + len(hashes)
        self._filter().add(hashes)
        self.blocks.add(hashes, row_ids)

    def committed(self, con: duckdb.DuckDBPyConnection) -> None:
        """The transaction of :meth:`append` committed: count its rows; a filter past its capacity is rebuilt."""
        self.rows = self._top
        self._local = []
        self.stale = False  # this transaction's sync counted the table, under the same lock
        self._pending = [*([] if self._pending_flushed else self._pending), *self._txn]
        self._txn, self._pending_flushed = [], False
        if self._filter().full:
            self.refill(con)

    def _filter(self) -> KeyFilter:
        if self.filter is None:
            raise StoreError(f"the key filter of {self.table} is used before KeyIndex.sync filled it")
        return self.filter


def key_hashes(keys: Sequence[str]) -> np.ndarray:
    """DuckDB's ``md5_number_lower`` of each key (bytes 8-15 of its UTF-8 MD5, little-endian), computed here:
    a statement less per write than asking DuckDB (whose SQL fills the key table on open and in
    :meth:`KeyIndex.sync`; tests/store/test_keys.py checks the two agree)."""
    md5 = hashlib.md5
    # whole digests joined, then every second 8-byte word: no slice object per key
    digests = b"".join([md5(k.encode()).digest() for k in keys])
    return np.frombuffer(digests, dtype="<u8")[1::2].astype(np.uint64)


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[Any, ...]:
    rows = con.execute(sql).fetchall()  # all of it: DuckDB refuses other work while a result is unfinished
    if len(rows) != 1:
        raise StoreError(f"expected one row, got {len(rows)}, from: {sql}")
    return tuple(rows[0])
