"""``ubi process`` while a real ``ubi consume --db`` process holds the store (issue 11).

The loader is DuckDB's one writer then, so ``ubi process`` must read the segments it seals and load its
judgments through it, with the ``?replace_source=`` it always sends. The loader used to serve its own
``http.server`` copy of the admin protocol, which took the table name from the last path segment
(``judgments?replace_source=implicit:ctr``) and answered 400; it now mounts ``ubi_pipeline.transport.admin``'s router.
"""

from __future__ import annotations

import duckdb
import orjson
import pytest
from kafka_support import Consume, wait_for

from tests.processors.ubi_records import build_sample_store
from tests.store_support import only_store_files
from ubi_pipeline.cli import main
from ubi_pipeline.store.client import sidecar_path

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]


def test_process_while_consume_holds_the_store(broker, prefix, tmp_path, capsys):
    db = build_sample_store(tmp_path / "ubi.duckdb")
    with duckdb.connect(str(db)) as con:  # a row of an earlier ctr run for a pair this run does not see
        con.execute("INSERT INTO judgments (query, doc_id, source, score, created_at) "
                    "VALUES ('stale query', 'gone-doc', 'implicit:ctr', 0.5, now())")
    loader = Consume(broker.bootstrap, prefix, f"{prefix}-g", tmp_path, db=db).start()
    try:
        wait_for(lambda: sidecar_path(db).exists(), 90, "ubi consume --db to advertise its admin routes")
        with pytest.raises(duckdb.IOException):  # the loader really holds the file
            duckdb.connect(str(db), read_only=True)
        # base 0 everywhere, as the hand-checked sample counts are (auto-detection makes Chorus base 1: 1,004 pairs)
        assert main(["process", "--db", str(db), "--model", "ctr", "--position-base", "0", "--json"]) == 0
        summary = orjson.loads(capsys.readouterr().out)
        # The same sample and model as tests/processors/test_process_commands.py's run through `ubi serve`:
        # 278 sessions, 1003 judgments, and the stale row of the source removed.
        assert (summary["sessions"]["sessions"], summary["stored"], summary["stale_rows_removed"]) == (278, 1003, True)
        assert only_store_files(db)  # read through sealed segments: no copy of the database, nothing left
    finally:
        loader.stop()
    assert loader.proc is not None and loader.proc.returncode == 0
    assert not sidecar_path(db).exists()
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*), min(source) FROM judgments").fetchall() == [(1003, "implicit:ctr")]
