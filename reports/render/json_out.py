"""The whole report as JSON: every aggregate with its interval and count, every per-query value, provenance."""

from __future__ import annotations

import io
import math
import uuid
from dataclasses import asdict, fields, is_dataclass
from datetime import datetime
from typing import Any, BinaryIO

import numpy as np
import orjson

from ubi_pipeline.reports import interleaving
from ubi_pipeline.reports.intervals import Interval, why_no_interval
from ubi_pipeline.reports.joint import Report
from ubi_pipeline.reports.render import common


def _clean(value: Any, memo: dict[int, tuple[Any, Any]] | None = None) -> Any:
    """JSON-ready data: NaN/inf -> null, numpy scalars -> numbers, tuples -> lists, datetimes -> ISO text.

    ``memo`` (id of a container -> (the container, its cleaned copy)) cleans a container that several values share
    once: the label pairs' parameters share their run-wide part (``ubi_pipeline.store.judgment_params``), 1.3 KB of nested
    dicts per label. The memo holds each container it names, so no id is reused while it lives; the caller
    keeps it for a batch and must not change the values meanwhile.
    """
    if memo is not None and isinstance(value, dict | list | tuple | np.ndarray):
        hit = memo.get(id(value))
        if hit is not None:
            return hit[1]
        out = _clean_one(value, memo)
        memo[id(value)] = (value, out)
        return out
    return _clean_one(value, memo)


def _clean_one(value: Any, memo: dict[int, tuple[Any, Any]] | None) -> Any:
    if isinstance(value, Interval):
        # bounds only where n allows an interval (ubi_pipeline.reports.intervals.why_no_interval), else null and why
        why = why_no_interval(value)
        return {"value": _clean(value.value), "low": None if why else _clean(value.low),
                "high": None if why else _clean(value.high), "n": value.n, "method": value.method,
                "no_interval": why}
    if isinstance(value, float | np.floating):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return [_clean(v, memo) for v in value.tolist()]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _clean(v, memo) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if hasattr(value, "_asdict"):
            return _clean(value._asdict(), memo)
        return [_clean(v, memo) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _clean(getattr(value, f.name), memo) for f in fields(value)}
    return value


def _config(report: Report) -> dict[str, Any]:
    cfg = asdict(report.config) if report.config.class_rules is None else {
        **{f.name: getattr(report.config, f.name) for f in fields(report.config) if f.name != "class_rules"},
        "class_rules": {"path": report.config.class_rules.path,
                        "rules": [[n, p.pattern] for n, p in report.config.class_rules.rules]},
    }
    cfg["metrics"] = list(report.config.metric_names)
    return _clean(cfg)


def _labels(report: Report, label_pairs: bool) -> dict[str, Any]:
    """Label counts per source, the merge summary and (unless left out) every pair with all its labels."""
    return {
        "counts": report.label_counts,
        "merge": _clean(report.merge),
        "pairs": [_clean(p.as_dict()) for p in report.label_pairs] if label_pairs else None,
        "pairs_omitted": not label_pairs,
    }


def _predicted(report: Report) -> dict[str, Any]:
    """The run systems' predictions (``Prediction.to_json``) beside the logged systems' observed figures."""
    k = report.config.k
    names = [m.replace("@k", f"@{k}") for m in ("ctr@k", "clicks_per_search", "abandonment", "rr_first_click")]
    return {
        "replicates": report.config.predict_replicates,
        "model": report.config.predict_model,
        "systems": {p.system: (p.prediction.to_json() if p.prediction is not None else {"error": p.error})
                    for p in report.predicted},
        "observed": {s: {"searches": om.searches, **{m: _clean(om.metrics[m]) for m in names if m in om.metrics}}
                     for s, om in report.online.items()},
    }


def _joint(report: Report) -> dict[str, Any]:
    """The joint view: per pair, every line with its interval and n, the signs and whether they agree."""
    pd = report.predicted_differences
    return {
        "predicted": None if pd is None else {
            "method": pd.method, "metric": pd.metric, "model": pd.model, "replicates": pd.replicates,
            "queries": pd.queries, "searches": pd.searches, "values": _clean(pd.values),
            "prior_share": _clean(pd.prior_share)},
        "pairs": [{
            "reference": pair.reference, "challenger": pair.challenger,
            "lines": [{"evidence": ln.evidence, "measure": ln.measure, "difference": _clean(ln.diff),
                       "low": _clean(ln.low), "high": _clean(ln.high), "n": ln.n, "unit": ln.unit,
                       "interval": ln.interval, "sign": ln.sign if ln.missing is None else None,
                       "excludes_zero": ln.clear, "missing": ln.missing} for ln in pair.lines],
            "agree_in_sign": pair.agree, "verdict": pair.verdict(),
        } for pair in report.pairs],
    }


def _comparison(c: Any) -> dict[str, Any]:
    """A paired comparison; below the bootstrap's minimum n its bounds are null, as every interval's are."""
    why = why_no_interval(Interval(c.diff, c.diff_low, c.diff_high, c.queries, "bootstrap"))
    out = {**_clean(c), "significant": c.significant(), "no_interval": why}
    if why is not None:
        out["diff_low"] = out["diff_high"] = None
    return out


def dumps(doc: dict[str, Any]) -> bytes:
    """The report document as bytes: ``verdict`` first (every format leads with it), then every other key sorted,
    indented by two (``orjson.OPT_INDENT_2 | OPT_SORT_KEYS``)."""
    rest = {k: v for k, v in doc.items() if k != "verdict"}
    text = orjson.dumps(rest, option=_OPTIONS)
    if "verdict" not in doc:
        return text
    head = orjson.dumps({"verdict": doc["verdict"]}, option=_OPTIONS)  # b'{\n  "verdict": ...\n}'
    return head[:-2] + (b",\n" + text[2:] if rest else b"\n}")


def report_dict(report: Report, *, label_pairs: bool = True) -> dict[str, Any]:
    """Everything in the report, per query and per labelled pair included, as plain JSON-ready data.

    ``label_pairs=False`` leaves the per-pair labels out (``labels.pairs`` is null), for large label sets.
    """
    offline = []
    for r in report.offline:
        offline.append({
            "system": r.system,
            "source": r.source,
            "unit": "searches" if report.config.mode == "each" else "queries",  # what the counts count
            "queries_evaluated": r.n_queries,
            "run_queries": r.run_queries,
            "unlabelled_queries": r.unlabelled_queries,
            "aggregate": _clean(r.aggregate),
            "labelled_negatives": {"count": len(r.negatives), "per_query": _clean(r.negatives)},
            "per_class": {c: {m: {"mean": _clean(v), "n": n} for m, (v, n) in ms.items()}
                          for c, ms in r.per_class.items()},
            "per_query": [
                {"query_id": q, "query": text, **({"class": c} if c is not None else {}),
                 **{m: _clean(r.per_query[m][i]) for m in r.metrics}}
                for i, (q, text, c) in enumerate(zip(r.query_ids, r.queries, r.classes, strict=True))
            ],
        })
    online: dict[str, Any] = {}
    for system, om in report.online.items():
        online[system] = {
            "searches": om.searches,  # the searches the figures rest on: the session filter's are left out
            "searches_left_out": {"total": om.searches_left_out, "by_reason": om.left_out},
            "searches_with_results": om.searches_with_results,
            "metrics": _clean(om.metrics),
            "ctr_by_rank": _clean(om.ctr_by_rank),
            "notes": om.notes,
        }
    for system in report.run_systems:
        online.setdefault(system, None)  # a run file was never shown to users: absent, not zero
    return {
        "verdict": _clean(report.verdict.as_dict()) if report.verdict is not None else None,
        "created_at": report.created_at.isoformat(),
        "inputs": _clean(report.inputs),
        "config": _config(report),
        "systems": _clean(report.systems),
        "sources": report.sources,
        "labels": _labels(report, label_pairs),
        "coverage": _clean(report.coverage),
        "offline": offline,
        "online": online,
        "interleaving": interleaving.to_json(report.interleaving),
        "predicted": _predicted(report),
        "joint": _joint(report),
        "agreement": {s: {**_clean(a), "confusion": _clean(a.confusion) if a.pairs else None,
                          "no_overlap": None if a.pairs else common.no_overlap_reason(s)}
                      for s, a in report.agreement.items()},
        "assessors": _clean(report.assessors),
        "comparisons": [_comparison(c) for c in report.comparisons],
        "orderings": _clean(report.orderings),
        "gates": {
            "passed": not report.failed_gates,
            "results": _clean(report.gates),
            "failed": [g.describe() for g in report.failed_gates],
        },
        "propensity": _clean(report.propensity),
        "identifiability": _clean(report.identifiability),
        "recommendation": _clean(report.recommendation),
        "notes": report.notes,
        "warnings": report.warnings,  # data quality; the text, Markdown and HTML reports show them first
    }


_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
#: label pairs cleaned and encoded together; each batch's memo cleans the parameters they share once
PAIR_BATCH = 5_000


def render_json(report: Report, *, label_pairs: bool = True) -> bytes:
    """The report as indented JSON bytes (see :func:`report_dict`); :func:`write_json` into memory."""
    buf = io.BytesIO()
    write_json(report, buf, label_pairs=label_pairs)
    return buf.getvalue()


def write_json(report: Report, out: BinaryIO, *, label_pairs: bool = True, batch: int = PAIR_BATCH) -> int:
    """Write the report's JSON to ``out``, the label pairs :data:`PAIR_BATCH` at a time; returns the bytes written.

    The bytes are those of ``dumps(report_dict(report)) + b"\\n"`` (the verdict first, then the keys sorted)
    (tests/reports/test_json_stream.py compares them), but the whole document is never held: at 20M events the
    label pairs (416,660 labels, each with its merged parameters) made a 1.59 GB document that took 1.6 GB more
    than the rest of ``ubi report`` to build as Python objects. The document is dumped with a placeholder in
    ``labels.pairs`` and the pairs written in its place, each batch dumped as an array by orjson and shifted
    to the placeholder's depth: with ``OPT_INDENT_2`` a value's text depends only on its depth, and no line
    break can occur inside a JSON string.
    """
    doc = report_dict(report, label_pairs=False)
    if not label_pairs:
        text = dumps(doc) + b"\n"
        out.write(text)
        return len(text)
    while True:  # a placeholder no string of the report happens to equal
        marker = f"ubi-label-pairs-{uuid.uuid4().hex}"
        doc["labels"]["pairs"], doc["labels"]["pairs_omitted"] = marker, False
        text = dumps(doc) + b"\n"
        quoted = orjson.dumps(marker)
        if text.count(quoted) == 1:
            break
    at = text.index(quoted)
    line_start = text.rindex(b"\n", 0, at) + 1
    pad = b" " * (len(text[line_start:at]) - len(text[line_start:at].lstrip(b" ")))
    written = out.write(text[:at]) or 0
    pairs = report.label_pairs
    if not pairs:
        written += out.write(b"[]") or 0
    else:
        written += out.write(b"[\n") or 0
        for start in range(0, len(pairs), batch):
            memo: dict[int, tuple[Any, Any]] = {}
            chunk = orjson.dumps([_clean(p.as_dict(), memo) for p in pairs[start:start + batch]], option=_OPTIONS)
            # b"[\n  {...},\n  {...}\n]": the items at depth 1; in the document they sit len(pad) deeper
            body = pad + chunk[2:-2].replace(b"\n", b"\n" + pad)
            written += out.write(body if start == 0 else b",\n" + body) or 0
        written += out.write(b"\n" + pad + b"]") or 0
    written += out.write(text[at + len(quoted):]) or 0
    return written
