"""Quality gates for CI: minimum (and maximum) values of report metrics; every shortfall is named.

Metric names are ``SOURCE/METRIC``: ``human/ndcg@10``, ``implicit:ctr/recall@10``, ``merged/mrr``,
``online/ctr@10``, ``online/abandonment``. A bare name (``ndcg@10``) means ``human/``. Thresholds file
(TOML, read with :mod:`tomllib`)::

    systems = ["shop/ranker=ltr"]   # optional: the systems gated (default: every system found)

    [min]                           # value must be >= threshold
    "ndcg@10" = 0.45
    "online/ctr@10" = 0.05

    [max]                           # value must be <= threshold (metrics where lower is better)
    "online/abandonment" = 0.6

    [system."shop/ranker=ltr".min]  # extra thresholds for one system
    "recall@10" = 0.5

A gate on a metric the report did not compute for a system fails (a gate that cannot fail measures
nothing), and so does one whose value is NaN (no query to compute it on).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ubi_pipeline.schemas.errors import InputFileError, UbiError

Op = Literal["min", "max"]
_TOML_LINE = re.compile(r"line (\d+)")


class GateError(UbiError):
    """A threshold given on the command line that cannot be read."""


@dataclass(frozen=True)
class Threshold:
    """``metric`` (qualified ``SOURCE/METRIC``) must be >= (``min``) or <= (``max``) ``value``."""

    metric: str
    op: Op
    value: float
    systems: tuple[str, ...] | None = None  # None: every system


@dataclass(frozen=True)
class GateResult:
    """One threshold checked on one system. ``value`` is NaN when the metric was not computed."""

    system: str
    metric: str
    op: Op
    threshold: float
    value: float
    n: int | None
    passed: bool
    reason: str

    def describe(self) -> str:
        sign = ">=" if self.op == "min" else "<="
        value = "no value" if math.isnan(self.value) else f"{self.value:.4g}"
        return f"{self.system}: {self.metric} = {value} (needs {sign} {self.threshold:g}; {self.reason})"


def _online_names() -> tuple[str, ...]:
    from ubi_pipeline.reports.online import ONLINE_METRICS

    return tuple(name for name, _ in ONLINE_METRICS)


def check_name(qualified: str) -> str:
    """``qualified`` when its metric part is one the report can compute, else a :class:`GateError` listing
    the known names (a typo such as ``ndgc@10`` is bad input, exit 2, never a failed gate)."""
    from ubi_pipeline.reports.metrics.names import KNOWN, MetricError, parse_metric

    source, _, m = qualified.rpartition("/")
    if source.startswith("interleaving/"):
        from ubi_pipeline.reports.interleaving import GATE_STATISTICS

        if m not in GATE_STATISTICS or not source.removeprefix("interleaving/"):
            raise GateError(f"unknown interleaving metric {qualified!r}; known: interleaving/<challenger>-vs-"
                            "<reference>/" + "|".join(GATE_STATISTICS))
        return qualified
    if source == "online":
        known = _online_names()
        base = "ctr@k" if re.fullmatch(r"ctr@[1-9][0-9]*", m) else m
        if base not in known:
            raise GateError(f"unknown online metric {qualified!r}; known: "
                            + ", ".join(f"online/{n}" for n in known) + " (ctr@k with k = --k)")
        return qualified
    try:
        parse_metric(m)
    except MetricError as exc:
        raise GateError(f"unknown metric {qualified!r} ({exc}); known offline metrics: {KNOWN}, as SOURCE/METRIC "
                        f"with SOURCE human, merged, reviewed or implicit:<model>; online: "
                        + ", ".join(f"online/{n}" for n in _online_names())) from exc
    return qualified


def qualify(metric: str) -> str:
    """``ndcg@10`` -> ``human/ndcg@10``; names are lower-cased and stripped; the source is kept as given."""
    name = metric.strip()
    if not name:
        raise GateError("empty metric name in a threshold")
    if "/" in name:
        source, _, m = name.rpartition("/")
        if not source or not m:
            raise GateError(f"metric {metric!r}: expected SOURCE/METRIC such as human/ndcg@10")
        return check_name(f"{source.strip()}/{m.strip().lower()}")
    return check_name(f"human/{name.lower()}")


def parse_flag(text: str, op: Op = "min") -> Threshold:
    """A ``--min METRIC=VALUE`` (or ``--max``) flag."""
    metric, sep, value = text.partition("=")
    if not sep:
        raise GateError(f"--{op} {text!r}: expected METRIC=VALUE, e.g. --{op} ndcg@10=0.5")
    try:
        number = float(value)
    except ValueError as exc:
        raise GateError(f"--{op} {text!r}: {value!r} is not a number") from exc
    if math.isnan(number):
        raise GateError(f"--{op} {text!r}: the threshold must be a number, not NaN")
    return Threshold(qualify(metric), op, number)


def _table(path: str, data: Any, where: str) -> dict[str, float]:
    if not isinstance(data, dict):
        raise InputFileError(path, None, f"[{where}] must be a table of \"METRIC\" = number")
    out = {}
    for metric, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise InputFileError(path, None, f"[{where}] {metric!r} = {value!r}: the threshold must be a number")
        out[metric] = float(value)
    return out


def load_thresholds(path: str | Path) -> list[Threshold]:
    """Read a thresholds TOML file (see the module docstring); errors name the file and, if known, the line."""
    p = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise InputFileError(p, None, f"cannot read the thresholds file: {exc.strerror or exc}") from exc
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputFileError(p, None, "not UTF-8 text; a thresholds file is TOML") from exc
    except tomllib.TOMLDecodeError as exc:
        m = _TOML_LINE.search(str(exc))
        raise InputFileError(p, int(m.group(1)) if m else None, f"malformed TOML: {exc}") from exc
    unknown = set(doc) - {"systems", "min", "max", "system"}
    if unknown:
        raise InputFileError(p, None, f"unknown key(s) {', '.join(sorted(unknown))}; expected systems, [min], "
                             "[max], [system.\"NAME\".min|max]")
    systems = doc.get("systems")
    if systems is not None and (not isinstance(systems, list) or not all(isinstance(s, str) for s in systems)):
        raise InputFileError(p, None, "systems must be a list of system names, e.g. systems = [\"shop\"]")
    scope = tuple(systems) if systems is not None else None
    out: list[Threshold] = []
    try:
        for op in ("min", "max"):
            for metric, value in _table(p, doc.get(op, {}), op).items():
                out.append(Threshold(qualify(metric), op, value, scope))  # type: ignore[arg-type]
        per_system = doc.get("system", {})
        if not isinstance(per_system, dict):
            raise InputFileError(p, None, "[system] must hold tables such as [system.\"shop\".min]")
        for name, tables in per_system.items():
            if not isinstance(tables, dict) or set(tables) - {"min", "max"}:
                raise InputFileError(p, None, f"[system.\"{name}\"] may only hold [min] and [max] tables")
            for op in ("min", "max"):
                for metric, value in _table(p, tables.get(op, {}), f"system.\"{name}\".{op}").items():
                    out.append(Threshold(qualify(metric), op, value, (name,)))  # type: ignore[arg-type]
    except GateError as exc:
        raise InputFileError(p, None, str(exc)) from exc
    if not out:
        raise InputFileError(p, None, "no thresholds: add a [min] or [max] table")
    return out


def check(
    thresholds: Sequence[Threshold],
    values: Mapping[str, Mapping[str, tuple[float, int | None]]],
) -> list[GateResult]:
    """Check every threshold on every system it applies to. ``values[system][metric] = (value, n)``."""
    results = []
    for t in thresholds:
        targets = list(t.systems) if t.systems is not None else sorted(values)
        for system in targets:
            got = values.get(system)
            if got is None:
                known = ", ".join(sorted(values)) or "none"
                results.append(GateResult(system, t.metric, t.op, t.value, float("nan"), None, False,
                                          f"system not found in the report (systems: {known})"))
                continue
            if t.metric not in got:
                results.append(GateResult(system, t.metric, t.op, t.value, float("nan"), None, False,
                                          "metric not computed for this system"))
                continue
            value, n = got[t.metric]
            if value is None or math.isnan(value):
                results.append(GateResult(system, t.metric, t.op, t.value, float("nan"), n, False,
                                          "no value (no query to compute it on)"))
                continue
            ok = value >= t.value if t.op == "min" else value <= t.value
            size = f"n={n}" if n is not None else ""
            verdict = size if ok else ", ".join(x for x in ("fell short" if t.op == "min" else "too high", size) if x)
            results.append(GateResult(system, t.metric, t.op, t.value, float(value), n, ok, verdict))
    return results


def failures(results: Sequence[GateResult]) -> list[GateResult]:
    return [r for r in results if not r.passed]
