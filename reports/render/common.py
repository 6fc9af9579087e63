"""Formatting shared by the text, Markdown and HTML renderers: the same rows, the same numbers."""

from __future__ import annotations

import math
from collections.abc import Iterator

from reports.intervals import Interval
from reports.joint import Report

Row = list[str]


def num(x: float | None, digits: int = 3) -> str:
    """A number for a table; NaN or None -> an en dash."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}f}"


def pval(p: float | None) -> str:
    if p is None or not math.isfinite(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def ci(iv: Interval | None, digits: int = 3) -> str:
    """``0.268 [0.190, 0.350]``, or the bare value when there is no interval."""
    if iv is None or not math.isfinite(iv.value):
        return "–"
    if not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return num(iv.value, digits)
    return f"{num(iv.value, digits)} [{num(iv.low, digits)}, {num(iv.high, digits)}]"


def header_lines(report: Report) -> list[str]:
    cfg = report.config
    lines = [f"created {report.created_at.isoformat()}"]
    for key in ("db", "qrels", "rating_map", "thresholds"):
        if report.inputs.get(key):
            lines.append(f"{key}: {report.inputs[key]}")
    lines.append(
        f"k={cfg.k}, gain={cfg.gain}, positive = grade >= {cfg.rel_threshold}, repeated searches: {cfg.mode} "
        f"({'most frequent ranking per query' if cfg.mode == 'modal' else 'every search on its own'}), "
        f"intervals: {int(cfg.confidence * 100)}%, seed {cfg.seed}"
    )
    return lines


def systems_table(report: Report) -> tuple[Row, list[Row]]:
    head = ["system", "searches", "queries", "unranked", "zero-result", "several rankings", "unstable queries",
            "modal share"]
    rows = [[s.name, str(s.searches), str(s.queries), str(s.unranked_searches), str(s.zero_result_searches),
             str(s.searches_with_several_rankings), str(s.unstable_queries), num(s.mean_modal_share, 2)]
            for s in report.systems]
    return head, rows


def labels_table(report: Report) -> tuple[Row, list[Row]]:
    head = ["source", "labels", "graded", "queries"]
    rows = [[s, str(c["labels"]), str(c["graded"]), str(c["queries"])] for s, c in report.label_counts.items()]
    return head, rows


def coverage_table(report: Report) -> tuple[Row, list[Row]]:
    k = report.config.k
    head = ["system", "source", "run queries", "labelled queries", f"judged@{k} (all run queries)"]
    rows = [[c.system, c.source, str(c.queries), str(c.queries_labelled), num(c.judged_at_k)] for c in report.coverage]
    return head, rows


def offline_tables(report: Report) -> Iterator[tuple[str, Row, list[Row]]]:
    """One table per judgment source: a row per metric, a column per system (mean [CI])."""
    metrics = report.config.metric_names
    for source in report.sources:
        results = [r for r in report.offline if r.source == source]
        head = ["", *[r.system for r in results]]
        rows = [["queries evaluated", *[str(r.n_queries) for r in results]]]
        rows += [[m, *[ci(r.aggregate.get(m)) for r in results]] for m in metrics]
        rows.append(["labelled negatives", *[str(len(r.negatives)) for r in results]])
        rows.append(["unlabelled run queries", *[str(r.unlabelled_queries) for r in results]])
        yield source, head, rows


def class_tables(report: Report) -> Iterator[tuple[str, Row, list[Row]]]:
    metrics = [m for m in report.config.metric_names if not m.startswith("judged")]
    for source in report.sources:
        rows = []
        for r in report.offline:
            if r.source != source:
                continue
            for cls, vals in r.per_class.items():
                n = next(iter(vals.values()))[1] if vals else 0
                rows.append([r.system, cls, str(n), *[num(vals[m][0]) for m in metrics if m in vals]])
        if rows:
            yield source, ["system", "class", "queries", *metrics], rows


def online_table(report: Report) -> tuple[Row, list[Row]]:
    """A row per online metric, a column per system: value [CI] (n searches, results or clicks)."""
    systems = list(report.online)
    names = list(report.online[systems[0]].metrics) if systems else []
    rows = [["searches", *[str(report.online[s].searches) for s in systems]]]
    for n in names:
        rows.append([n, *[f"{ci(report.online[s].metrics[n])} (n={report.online[s].metrics[n].n})" for s in systems]])
    return ["", *systems], rows


def agreement_table(report: Report) -> tuple[Row, list[Row]]:
    head = ["source", "pairs", "excluded (calibration)", "kappa (quadratic)", "Spearman", "Kendall"]
    rows = [[s, str(a.pairs), str(a.excluded_calibration), num(a.kappa), num(a.spearman), num(a.kendall)]
            for s, a in report.agreement.items()]
    return head, rows


def confusion_rows(report: Report, source: str) -> tuple[Row, list[Row]]:
    a = report.agreement[source]
    head = ["human \\ implicit", *[str(g) for g in a.grades]]
    return head, [[str(g), *[str(v) for v in row]] for g, row in zip(a.grades, a.confusion, strict=True)]


def comparison_table(report: Report) -> tuple[Row, list[Row]]:
    head = ["system", "source", "metric", "queries", "baseline", "system mean", "diff [CI]", "t-test p",
            "randomisation p", "Holm p", "W/L/T"]
    rows = []
    for c in report.comparisons:
        diff = f"{c.diff:+.3f} [{num(c.diff_low)}, {num(c.diff_high)}]" if math.isfinite(c.diff) else "–"
        mark = " *" if c.significant() else ""
        rows.append([c.system, c.source, c.metric, str(c.queries), num(c.mean_baseline), num(c.mean_system), diff,
                     pval(c.t_p), pval(c.randomisation_p), pval(c.randomisation_p_holm) + mark,
                     f"{c.wins}/{c.losses}/{c.ties}"])
    return head, rows


def ordering_table(report: Report) -> tuple[Row, list[Row]]:
    head = ["offline metric", "online metric", "offline order", "online order", "systems", "Kendall", "Spearman"]
    rows = [[o.offline_metric, o.online_metric, " > ".join(o.offline_order), " > ".join(o.online_order),
             str(o.systems), num(o.kendall), num(o.spearman)] for o in report.orderings]
    return head, rows


def gates_table(report: Report) -> tuple[Row, list[Row]]:
    head = ["system", "metric", "threshold", "value", "result"]
    rows = []
    for g in report.gates:
        sign = ">=" if g.op == "min" else "<="
        rows.append([g.system, g.metric, f"{sign} {g.threshold:g}", num(g.value, 4),
                     ("PASS" if g.passed else "FAIL") + f" ({g.reason})"])
    return head, rows


def summary_line(report: Report) -> str:
    n_sys = len(report.systems)
    failed = report.failed_gates
    gate = "" if not report.gates else (f"; gates: {len(failed)} failed" if failed else "; gates: all passed")
    return f"{n_sys} system(s), sources: {', '.join(report.sources) or 'none'}{gate}"
