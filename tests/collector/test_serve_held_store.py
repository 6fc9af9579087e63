"""A second `ubi serve` on a store a running collector holds is told who holds it (issue 12, item 6)."""

from __future__ import annotations

import subprocess
import sys

from tests_collector_support import ROOT, start_server


def test_second_serve_names_the_running_collector(tmp_path):
    db = tmp_path / "ubi.duckdb"
    first = start_server(db)
    try:
        proc = subprocess.run([sys.executable, "-m", "ubi", "serve", "--db", str(db), "--port", "0"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2
        err = " ".join(proc.stderr.split())
        assert f"{db} is already held by the collector at {first.url}" in err
        assert "a second `ubi serve` cannot open it" in err
        assert "point this command at the running collector" not in err  # the old, wrong advice
        assert first.proc.poll() is None  # the first one keeps serving
    finally:
        assert first.stop() == 0
