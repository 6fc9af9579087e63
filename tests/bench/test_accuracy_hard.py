"""bench/accuracy_hard.py --models: only the models asked for are fitted, and the recommendation is among them
(never COEC: the rule of ``ubi_pipeline.processors.click_models.selection``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():  # the bench is a script, not a package module: load it from its file
    spec = importlib.util.spec_from_file_location("accuracy_hard", ROOT / "bench" / "accuracy_hard.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["accuracy_hard"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_models_restricts_fits_and_recommendation() -> None:
    bench = _bench()
    r = bench.run(400, "cascade", 0, True, ("coec", "pbm"))
    assert r["models"] == ["coec", "pbm"]
    assert set(r["perplexity"]) == {"coec", "pbm"}
    assert set(r["relevance"]) == {"raw CTR", "coec", "pbm"}
    # COEC is fitted and scored but never recommended (ubi_pipeline.processors.click_models.selection.NOT_CANDIDATES): pbm is the one left
    assert r["recommended"] == "pbm"
    table = bench.markdown([r], None)
    ubm_row = next(line for line in table.splitlines() if line.startswith("| ubm |"))
    assert ubm_row == "| ubm | - |"  # not fitted: a dash, not a number
