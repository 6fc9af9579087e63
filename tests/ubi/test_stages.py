"""``ubi``'s start-up: pyarrow's look for pandas is made once with pandas hidden (ubi/stages.py).

Each check runs in a fresh interpreter: whether pandas is imported is process state. The README's venv has
pandas (the tests need it), which is where the look cost 0.2-0.3 s of every command (``ubi import`` of one
record: 0.93-1.02 s before, 0.57-0.63 s after, on the project's machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pandas")  # without pandas there is nothing to hide: the checks would pass vacuously


def _python(script: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_arrays_built_after_the_skip_do_not_import_pandas_and_to_pandas_still_works() -> None:
    out = _python("""
import datetime, json, sys
import numpy as np, pyarrow as pa, pyarrow.compute as pc
from ubi_pipeline.stages import skip_pyarrow_pandas_probe
skip_pyarrow_pandas_probe()
pa.array([1, 2]); pa.array(np.arange(3)); pa.array(["a", None]); pa.array([datetime.datetime(2024, 5, 1)])
pc.take(pa.array([1, 2]), np.arange(1))
before = "pandas" in sys.modules
frame = pa.table({"a": [1, 2]}).to_pandas()
print(json.dumps({"before": before, "frame": type(frame).__name__, "sum": int(frame["a"].sum())}))
""")
    assert out == {"before": False, "frame": "DataFrame", "sum": 3}


def test_the_same_arrays_import_pandas_without_the_skip() -> None:
    # the control: the check above would see pandas if pyarrow still loaded it
    out = _python("""
import json, sys
import pyarrow as pa
pa.array([1, 2])
print(json.dumps({"pandas": "pandas" in sys.modules}))
""")
    assert out == {"pandas": True}


def test_ubi_import_runs_without_pandas(tmp_path: Path) -> None:
    events = tmp_path / "events.ndjson"
    events.write_text(json.dumps({"action_name": "click", "query_id": "q1", "timestamp": "2024-05-01T10:00:00Z",
                                  "event_attributes": {"object": {"object_id": "d1"}}}) + "\n")
    db = tmp_path / "ubi.duckdb"
    out = _python(f"""
import contextlib, io, json, sys
from ubi_pipeline.cli import main
with contextlib.redirect_stdout(io.StringIO()) as printed:
    code = main(["import", {str(events)!r}, "--db", {str(db)!r}, "--json"])
print(json.dumps({{"code": code, "pandas": "pandas" in sys.modules, "report": json.loads(printed.getvalue())}}))
""")
    assert out["code"] == 0 and out["pandas"] is False
    assert (out["report"]["events"], out["report"]["rejected"]) == (1, 0), out["report"]
