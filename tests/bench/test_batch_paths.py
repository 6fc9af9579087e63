"""bench/batch_paths.py times the two paths on the same bodies: both must store every event they are given,
or the figures would compare different work."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():  # the bench is a script, not a package module: load it from its file
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("batch_paths", ROOT / "bench" / "batch_paths.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["batch_paths"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.mark.parametrize("shape", ["simulator", "js-client"])
def test_both_paths_store_every_event_of_the_bodies(shape: str) -> None:
    bench = _bench()
    bodies = bench.shaped_bodies(bench.make_events(1500, shape), bench.BATCH, bench.SHAPES[shape])
    n = len(bodies) * bench.BATCH
    stages, stored = bench.exact(bodies, n)
    assert stored == n == 1500
    assert set(stages) == {"orjson", "pydantic", "rows", "write"} and all(v > 0 for v in stages.values())
    per_event, stored = bench.columnar(bodies, n, 2)  # 2 bodies per call: a group of 1,000 and one of 500
    assert stored == n and per_event > 0
