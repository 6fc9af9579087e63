"""Prometheus text exposition written by hand: checked against hand-computed buckets."""

from __future__ import annotations

from ubi_pipeline.collector.metrics import Metrics


def test_histogram_buckets_are_cumulative():
    m = Metrics()
    for seconds in (0.0004, 0.003, 2.0):
        m.observe_latency(seconds, route="/v1/events", method="POST")
    lines = m.render().splitlines()
    bucket = {
        line.split('le="')[1].split('"')[0]: int(line.split()[-1])
        for line in lines
        if line.startswith("ubi_request_duration_seconds_bucket")
    }
    # 0.0004 <= 0.0005; 0.003 <= 0.005; 2.0 <= 2.5: cumulative counts 1, 1, 1, 2 ... 2, 3 from le=2.5 on
    assert bucket["0.0005"] == 1 and bucket["0.001"] == 1 and bucket["0.0025"] == 1
    assert bucket["0.005"] == 2 and bucket["1"] == 2
    assert bucket["2.5"] == 3 and bucket["+Inf"] == 3
    assert 'ubi_request_duration_seconds_count{method="POST",route="/v1/events"} 3' in lines
    total = next(float(x.split()[-1]) for x in lines if x.startswith("ubi_request_duration_seconds_sum"))
    assert abs(total - 2.0034) < 1e-12  # 0.0004 + 0.003 + 2.0


def test_counters_labels_and_gauges():
    m = Metrics()
    m.inc("ubi_records_accepted_total", 3, kind="event", route="/v1/events")
    m.inc("ubi_records_accepted_total", 2, kind="event", route="/v1/events")
    m.inc("ubi_records_accepted_total", 0, kind="query", route="/v1/events")  # zero: no series
    m.inc("ubi_bodies_kept_total", 1, kind='we"ird\\', route="/x\ny")
    text = m.render({"ubi_sink_spool_depth": ("records waiting", {(("sink", "kafka"),): 7.0})})
    assert 'ubi_records_accepted_total{kind="event",route="/v1/events"} 5' in text
    assert 'kind="query"' not in text
    assert 'ubi_bodies_kept_total{kind="we\\"ird\\\\",route="/x\\ny"} 1' in text
    assert '# TYPE ubi_sink_spool_depth gauge\nubi_sink_spool_depth{sink="kafka"} 7' in text
    assert m.value("ubi_records_accepted_total", kind="event", route="/v1/events") == 5
    assert text.count("# TYPE ") == 8  # six counters (ubi_requests_refused_total too), the histogram, the gauge
