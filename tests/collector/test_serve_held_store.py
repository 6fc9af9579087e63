"""A second `ubi serve` on a store a running collector holds is told who holds it (issue 12, item 6)."""

from __future__ import annotations

import subprocess
import sys

from tests_collector_support import ROOT, start_server


def test_second_serve_names_the_running_collector(tmp_path):
    db = tmp_path / "ubi.duckdb"
    first = start_server(db)
    try:
        proc = subprocess.run([sys.executable, "-m", "ubi_pipeline", "serve", "--db", str(db), "--port", "0"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2
        err = " ".join(proc.stderr.split())
        assert f"{db} is already held by the collector at {first.url}" in err
        assert "a second `ubi serve` cannot open it" in err
        assert "point this command at the running collector" not in err  # the old, wrong advice
        assert first.proc.poll() is None  # the first one keeps serving
    finally:
        assert first.stop() == 0


def _serve_with_failing_sink(monkeypatch, capsys, tmp_path, exc):
    """`ubi serve` whose sink fails to open with ``exc``: its exit code and what it printed."""
    import ubi_pipeline.collector.sinks
    from ubi_pipeline.cli import main

    def fail(settings):
        raise exc

    monkeypatch.setattr(ubi_pipeline.collector.sinks, "create_sink", fail)
    code = main(["serve", "--db", str(tmp_path / "ubi.duckdb"), "--host", "127.0.0.1", "--port", "0"])
    return code, " ".join(capsys.readouterr().err.split())


def test_serve_tells_a_reader_from_a_writer_by_the_error_type(monkeypatch, capsys, tmp_path):
    """The store raises StoreHeldByReader when only readers hold the file, and ubi serve keeps that message;
    any other StoreLocked (a writer holds it) becomes the held-store message. Decided by type, not by the
    message's words (74e9b3e matched "open read-only by process" in the text, so a reworded store message
    would have blamed a collector)."""
    from ubi_pipeline.schemas.errors import StoreHeldByReader, StoreLocked

    code, err = _serve_with_failing_sink(monkeypatch, capsys, tmp_path, StoreHeldByReader("a reader (pid 7) holds it"))
    assert code == 2 and "a reader (pid 7) holds it" in err and "is already held by" not in err, err

    code, err = _serve_with_failing_sink(monkeypatch, capsys, tmp_path, StoreLocked("open read-only by process 7"))
    assert code == 2 and "is already held by another process (no collector advertises it)" in err, err
    assert "open read-only by process 7" not in err
