"""The collector's Prometheus metrics, written in the text exposition format (version 0.0.4) by hand.

A handful of counters and one histogram do not justify ``prometheus_client`` (a dependency, a global
registry that tests must reset, and a per-observation lock): this module is ~100 lines, and updates are
plain dict arithmetic on the event loop thread.
Format: https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping

#: Request latency buckets in seconds (Prometheus' defaults, plus finer steps below 5 ms for single events).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels, extra: Iterable[tuple[str, str]] = ()) -> str:
    pairs = [*labels, *extra]
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _num(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if isinstance(value, float) and not value.is_integer() else str(int(value))


class Histogram:
    """Cumulative-bucket histogram of one label set."""

    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
        self.total += value
        self.count += 1


class Metrics:
    """The collector's counters and histograms; :meth:`render` gives the exposition text."""

    COUNTERS = {
        "ubi_records_accepted_total": "Records stored (newly written), by record kind and route.",
        "ubi_records_duplicate_total": "Records already stored (retries, replays), by record kind and route.",
        "ubi_records_rejected_total": "Items rejected and kept in failed_records, by record kind and route.",
        "ubi_requests_total": "HTTP requests answered, by route, method and status code.",
        "ubi_bodies_kept_total": "Whole request bodies kept in failed_records (unparseable or refused).",
        "ubi_requests_refused_total": "Requests refused before their body was read, by reason (cors_origin: "
        "a browser origin not in UBI_CORS_ALLOW_ORIGINS / --allow-origin; origin, unauthorized, rate_limited, "
        "admin_remote).",
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = {name: defaultdict(float) for name in self.COUNTERS}
        self._latency: dict[Labels, Histogram] = {}

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        if amount:
            key = tuple(sorted(labels.items()))
            with self._lock:
                self._counters[name][key] += amount

    def observe_latency(self, seconds: float, *, route: str, method: str) -> None:
        key = (("method", method), ("route", route))
        with self._lock:
            hist = self._latency.get(key)
            if hist is None:
                hist = self._latency[key] = Histogram()
            hist.observe(seconds)

    def request_done(self, seconds: float, *, route: str, method: str, status: int) -> None:
        """One answered request: its latency and its count by status."""
        self.observe_latency(seconds, route=route, method=method)
        self.inc("ubi_requests_total", route=route, method=method, status=str(status))

    def value(self, name: str, **labels: str) -> float:
        """One counter's current value (0 when never incremented)."""
        return self._counters[name].get(tuple(sorted(labels.items())), 0.0)

    def render(self, gauges: Mapping[str, tuple[str, Mapping[Labels, float]]] | None = None) -> str:
        """The exposition text; ``gauges`` maps a metric name to (help, {labels: value})."""
        out: list[str] = []
        with self._lock:
            for name, help_text in self.COUNTERS.items():
                out.append(f"# HELP {name} {help_text}")
                out.append(f"# TYPE {name} counter")
                for labels, value in sorted(self._counters[name].items()):
                    out.append(f"{name}{_labels(labels)} {_num(value)}")
            name = "ubi_request_duration_seconds"
            out.append(f"# HELP {name} Time from request start to the last response byte, by route.")
            out.append(f"# TYPE {name} histogram")
            for labels, hist in sorted(self._latency.items()):
                cumulative = 0
                for bound, n in zip((*LATENCY_BUCKETS, float("inf")), hist.counts, strict=True):
                    cumulative += n
                    out.append(f"{name}_bucket{_labels(labels, [('le', _num(bound))])} {cumulative}")
                out.append(f"{name}_sum{_labels(labels)} {_num(hist.total)}")
                out.append(f"{name}_count{_labels(labels)} {hist.count}")
        for name, (help_text, series) in sorted((gauges or {}).items()):
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} gauge")
            for labels, value in sorted(series.items()):
                out.append(f"{name}{_labels(labels)} {_num(value)}")
        return "\n".join(out) + "\n"
