"""The collector's local spool: a durable FIFO of acknowledged batches (files on disk, no broker)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ubi_pipeline.collector.errors import SinkUnavailable
from ubi_pipeline.collector.sinks.kafka import decode_messages, encode_messages
from ubi_pipeline.collector.spool import HEADER, Spool, SpoolFull, SpoolLocked, claim, orphaned_slots
from ubi_pipeline.transport.wire import Message


def drain(spool: Spool, max_records: int = 7) -> list[bytes]:
    out = []
    while not spool.empty:
        entries = spool.read(max_records=max_records)
        out.extend(e.payload for e in entries)
        spool.ack(entries)
    return out


def test_entries_come_back_in_order_across_segments_and_restarts(tmp_path):
    spool = Spool(tmp_path / "s", segment_bytes=100)
    payloads = [f"batch-{i:03d}".encode() * (i % 4 + 1) for i in range(30)]
    spool.append((i, p) for i, p in enumerate(payloads))
    assert spool.depth_entries == 30 and spool.depth_records == sum(range(30))
    assert len(list((tmp_path / "s").glob("seg-*.log"))) == 1  # one append: one frame run, one fsync
    first = spool.read(max_records=10)
    assert [e.payload for e in first] == payloads[:len(first)]
    spool.ack(first[:3])
    spool.close()
    # A new owner (the restarted collector) replays from the cursor: acknowledged entries are gone.
    again = Spool(tmp_path / "s", segment_bytes=100)
    assert again.depth_entries == 27
    assert drain(again) == payloads[3:]
    assert again.replayed_records == sum(range(3, 30))
    again.close()


def test_small_segments_rotate_and_replayed_ones_are_deleted(tmp_path):
    spool = Spool(tmp_path / "s", segment_bytes=64)
    for _ in range(10):
        spool.append([(1, b"x" * 50)])  # each frame (16 + 50 bytes) fills a segment
    assert len(list((tmp_path / "s").glob("seg-*.log"))) == 10
    drain(spool, max_records=3)
    assert len(list((tmp_path / "s").glob("seg-*.log"))) == 1  # only the one being written to is left
    spool.append([(1, b"after")])
    assert drain(spool) == [b"after"]


def test_a_torn_tail_is_cut_off_and_earlier_entries_kept(tmp_path):
    spool = Spool(tmp_path / "s")
    spool.append([(1, b"one"), (1, b"two")])
    spool.close()
    (seg,) = (tmp_path / "s").glob("seg-*.log")
    with open(seg, "ab") as fh:  # a crash in the middle of the next append, before its fsync
        fh.write(HEADER.pack(b"UBIS", 100, 1, 0) + b"partial")
    spool = Spool(tmp_path / "s")
    assert spool.depth_entries == 2
    spool.append([(1, b"three")])
    assert drain(spool) == [b"one", b"two", b"three"]


def test_a_corrupt_frame_stops_the_replay_there(tmp_path):
    spool = Spool(tmp_path / "s")
    spool.append([(1, b"good"), (1, b"flipped")])
    spool.close()
    (seg,) = (tmp_path / "s").glob("seg-*.log")
    data = bytearray(seg.read_bytes())
    data[-1] ^= 0xFF  # CRC of the second frame no longer matches
    seg.write_bytes(bytes(data))
    spool = Spool(tmp_path / "s")
    assert drain(spool) == [b"good"]


def test_full_spool_refuses_with_503_and_retry_after(tmp_path):
    spool = Spool(tmp_path / "s", max_bytes=200)
    spool.append([(1, b"x" * 100)])
    with pytest.raises(SpoolFull) as err:
        spool.append([(1, b"y" * 100)])
    assert isinstance(err.value, SinkUnavailable) and err.value.status_code == 503
    assert err.value.headers["Retry-After"] == "5"
    assert spool.depth_entries == 1  # all or nothing
    drain(spool)
    spool.append([(1, b"y" * 100)])  # room again once replayed


def test_one_owner_per_spool_and_slots_for_several_collectors(tmp_path):
    a = claim(tmp_path)
    b = claim(tmp_path)
    assert (a.dir.name, b.dir.name) == ("slot-0", "slot-1")
    with pytest.raises(SpoolLocked):
        Spool(a.dir)
    b.append([(1, b"left behind")])
    b.close()  # its collector died: the slot is free and holds data
    assert orphaned_slots(tmp_path, a.dir) == [b.dir]
    adopted = Spool(b.dir)
    assert drain(adopted) == [b"left behind"]
    a.close()
    adopted.close()


def test_a_killed_process_releases_its_spool_and_keeps_what_it_acknowledged(tmp_path):
    """SIGKILL right after an append returned: the entry is on disk (fsync'd) and the lock is gone."""
    code = textwrap.dedent(f"""
        import os, signal
        from ubi_pipeline.collector.spool import Spool
        s = Spool({str(tmp_path / 's')!r})
        s.append([(3, b"acknowledged")])
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=os.getcwd(), check=False)
    assert proc.returncode == -9
    spool = Spool(tmp_path / "s")
    assert spool.depth_records == 3 and drain(spool) == [b"acknowledged"]


_msg = st.builds(Message, st.sampled_from(["queries", "events", "failed"]),
                 st.one_of(st.none(), st.binary(max_size=20)), st.binary(max_size=60))


@given(st.lists(_msg, max_size=20))
def test_spool_payloads_decode_to_the_messages_encoded(msgs):
    assert decode_messages(encode_messages(msgs)) == msgs


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "replay", "reopen"]), st.integers(1, 5)), max_size=25),
       st.integers(40, 400))
def test_spool_behaves_as_a_durable_fifo(tmp_path_factory, ops, segment_bytes):
    """Law: whatever the mix of appends, partial replays and reopenings, the spool yields exactly the
    appended payloads not yet acknowledged, in append order."""
    d = tmp_path_factory.mktemp("fifo")
    spool = Spool(d, segment_bytes=segment_bytes)
    model: list[bytes] = []
    n = 0
    for op, k in ops:
        if op == "append":
            batch = [f"p{n + i}".encode() * (1 + (n + i) % 5) for i in range(k)]
            n += k
            spool.append((1, p) for p in batch)
            model.extend(batch)
        elif op == "replay":
            entries = spool.read(max_records=k)
            assert [e.payload for e in entries] == model[:len(entries)]
            spool.ack(entries)
            del model[:len(entries)]
        else:
            spool.close()
            spool = Spool(d, segment_bytes=segment_bytes)
        assert spool.depth_entries == len(model)
    assert drain(spool) == model
    spool.close()
