"""The report as ONE self-contained HTML file: inline CSS, inline SVG plots (matplotlib), no external resource.

Plots: CTR by rank per system with Wilson intervals; the propensity curve with its bootstrap intervals when an
estimate is attached; metric bars with bootstrap intervals per system and judgment source; the agreement
confusion matrix of each implicit source; a forest plot per pair of systems (the joint view). Tables are the same rows as the text and Markdown renderers.
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ubi_pipeline.reports import interleaving
from ubi_pipeline.reports.intervals import why_no_interval
from ubi_pipeline.reports.joint import Report
from ubi_pipeline.reports.pairs import PairView
from ubi_pipeline.reports.render import common

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
# text.parse_math off: system names and queries are producers' text, and matplotlib would read "$...$" in them as
# mathtext (a ranker named "$\\foo{$" made the HTML report fail)
_RC: Any = {"svg.fonttype": "none", "svg.hashsalt": "ubi-report", "font.size": 9, "axes.spines.top": False,
       "axes.spines.right": False, "text.parse_math": False}

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1200px;
color:#1b1f24;padding:0 16px}
h1{font-size:1.6em;margin-bottom:4px}h2{font-size:1.2em;margin-top:32px;border-bottom:1px solid #d0d7de;
padding-bottom:4px}h3{font-size:1em;margin-top:18px}
.meta{color:#57606a;font-size:.9em;margin:2px 0}
table{border-collapse:collapse;margin:8px 0;font-size:.85em}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:right;white-space:nowrap}
th{background:#f6f8fa}td:first-child,th:first-child{text-align:left}
.plots{display:flex;flex-wrap:wrap;gap:16px}.plot{border:1px solid #d0d7de;border-radius:6px;padding:8px}
.plot svg{display:block;max-width:100%;height:auto}
.fail{color:#cf222e;font-weight:600}.pass{color:#1a7f37;font-weight:600}
.note{color:#57606a;font-size:.85em}.warn{color:#9a6700}
.verdict{border:2px solid #0969da;border-radius:6px;padding:8px 16px;background:#f6f8fa}
.verdict .headline{font-size:1.1em}
nav.toc{border:1px solid #d0d7de;border-radius:6px;padding:4px 16px;margin:12px 0;font-size:.9em}
nav.toc ol{margin:4px 0;padding-left:20px;columns:2}
"""


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure(width: float = 5.2, height: float = 3.2) -> Figure:
    with matplotlib.rc_context(_RC):
        return Figure(figsize=(width, height), dpi=100)


def _color(i: int) -> str:
    return _PALETTE[i % len(_PALETTE)]


def ctr_by_rank_svg(report: Report) -> str | None:
    """CTR at each rank per system, with the Wilson interval as a band."""
    series = [(s, om.ctr_by_rank) for s, om in report.online.items() if om.ctr_by_rank is not None]
    series = [(s, r) for s, r in series if r is not None and any(r.shown)]
    if not series:
        return None
    with matplotlib.rc_context(_RC):
        fig = _figure()
        ax = fig.add_subplot()
        for i, (system, r) in enumerate(series):
            keep = np.array(r.shown) > 0
            ranks = np.array(r.rank)[keep]
            ax.plot(ranks, np.array(r.ctr)[keep], marker="o", ms=3, color=_color(i), label=system)
            ax.fill_between(ranks, np.array(r.low)[keep], np.array(r.high)[keep], color=_color(i), alpha=0.18, lw=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("rank")
        ax.set_ylabel("CTR (clicked / displayed)")
        ax.set_title("CTR by rank (95% Wilson interval)")
        ax.set_ylim(bottom=0)
        ax.legend(frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16),
                  ncol=min(len(series), 3))
        return _svg(fig)


def propensity_interval_label(propensity: dict) -> str:
    """" (95% interval, queries resampled)": the level and the bootstrap unit of a ``ubi propensity`` JSON."""
    level = propensity.get("level")
    parts = [f"{level * 100:.0f}% interval"] if (isinstance(level, float | int) and not isinstance(level, bool)
                                                 and math.isfinite(level)) else []
    boot = propensity.get("bootstrap")
    scheme = str(boot.get("scheme", "")) if isinstance(boot, dict) else ""  # a hand-written file may lack it
    unit = "queries" if "queries" in scheme else "sessions" if "sessions" in scheme else None
    if parts and unit:
        parts.append(f"{unit} resampled")
    return f" ({', '.join(parts)})" if parts else ""


def propensity_svg(propensity: dict | None) -> str | None:
    """θ_k/θ_1 per rank with its interval (the shape of ``PropensityEstimate.to_json()``)."""
    if not propensity or not propensity.get("ranks"):
        return None
    rows = propensity["ranks"]
    k = np.array([r["rank"] for r in rows], dtype=float)

    def col(name: str) -> np.ndarray:
        return np.array([np.nan if r.get(name) is None else r[name] for r in rows], dtype=float)

    ratio, lo, hi = col("ratio"), col("ci_low"), col("ci_high")
    ok = np.isfinite(ratio) & np.isfinite(k)
    if not ok.any():
        return None
    # The interval is drawn from its own bounds, not as an error bar around the estimate: a basic-bootstrap
    # interval (method em) need not contain the estimate on small logs, and yerr cannot be negative.
    bounded = ok & np.isfinite(lo) & np.isfinite(hi)
    outside = bounded & ((ratio < np.minimum(lo, hi)) | (ratio > np.maximum(lo, hi)))
    with matplotlib.rc_context(_RC):
        fig = _figure()
        ax = fig.add_subplot()
        ax.vlines(k[bounded], np.minimum(lo, hi)[bounded], np.maximum(lo, hi)[bounded], color=_color(0), lw=1.2)
        ax.plot(k[ok], ratio[ok], "o-", ms=3, color=_color(0))
        if outside.any():
            ax.plot(k[outside], ratio[outside], "o", ms=5, mfc="none", color=_color(1),
                    label="estimate outside its interval")
            ax.legend(frameon=False, fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("rank k")
        ax.set_ylabel("θₖ / θ₁")
        label = propensity_interval_label(propensity)
        ax.set_title(f"Position bias, method {html.escape(str(propensity.get('method', '?')))}{label}")
        if np.nanmin(np.where(bounded, np.minimum(lo, hi), ratio)[ok]) >= 0:
            ax.set_ylim(bottom=0)
        return _svg(fig)


def metric_bars_svg(report: Report, source: str) -> str | None:
    """Grouped bars: a group per metric, a bar per system, bootstrap interval as the error bar."""
    results = [r for r in report.offline if r.source == source and r.n_queries > 0]
    if not results:
        return None
    metrics = list(report.config.metric_names)
    width = 0.8 / len(results)
    x = np.arange(len(metrics))
    with matplotlib.rc_context(_RC):
        fig = _figure(max(5.2, 0.9 * len(metrics) + 1.5), 3.2)
        ax = fig.add_subplot()
        for i, r in enumerate(results):
            ivs = [r.aggregate[m] for m in metrics]
            vals = np.array([iv.value for iv in ivs])
            pos = x + (i - (len(results) - 1) / 2) * width
            why = [why_no_interval(iv) for iv in ivs]
            label = f"{r.system} (n={r.n_queries}" + ("; no interval: too few queries)" if all(why) else ")")
            ax.bar(pos, np.nan_to_num(vals), width, color=_color(i), label=label)
            shown = np.array([w is None for w in why])
            if shown.any():  # bars only where n allows an interval (never zero-width bars for n = 1)
                lo = np.array([iv.low for iv in ivs])[shown]
                hi = np.array([iv.high for iv in ivs])[shown]
                ax.vlines(pos[shown], np.minimum(lo, hi), np.maximum(lo, hi), color="black", lw=0.8)
        ax.set_xticks(x, metrics)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"Offline metrics on {source} labels (95% interval where n allows)")
        ax.legend(frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1),
                  ncol=min(len(results), 3))
        return _svg(fig)


def confusion_svg(report: Report, source: str) -> str:
    """Heat map of the human x implicit grade counts, with the counts written in."""
    a = report.agreement[source]
    m = np.array(a.confusion, dtype=float)
    with matplotlib.rc_context(_RC):
        fig = _figure(3.6, 3.2)
        ax = fig.add_subplot()
        ax.imshow(m, cmap="Blues", vmin=0)
        top = m.max() if m.size else 0
        for (i, j), v in np.ndenumerate(m):
            ax.text(j, i, f"{int(v)}", ha="center", va="center", color="white" if top and v > top / 2 else "black")
        ax.set_xticks(range(len(a.grades)), [str(g) for g in a.grades])
        ax.set_yticks(range(len(a.grades)), [str(g) for g in a.grades])
        ax.set_xlabel(f"{source} grade")
        ax.set_ylabel("human grade")
        kappa = "–" if not math.isfinite(a.kappa) else f"{a.kappa:.2f}"
        ax.set_title(f"{source}: {a.pairs} pairs, κ = {kappa}")
        return _svg(fig)


def forest_svg(pair: PairView) -> str:
    """Forest plot of one pair: a row per line of evidence, its difference and interval, a line at 0.

    The lines are on different scales (module ``ubi_pipeline.reports.pairs``); the plot shows where each lies against 0,
    which is what the joint view compares. A line without a figure is listed with why, at no position.
    """
    lines = list(pair.lines)
    with matplotlib.rc_context(_RC):
        fig = _figure(6.4, 0.55 * len(lines) + 1.2)
        ax = fig.add_subplot()
        y = np.arange(len(lines))[::-1]
        labels = []
        for yi, ln in zip(y, lines, strict=True):
            labels.append(f"{ln.evidence}\n{ln.measure}" + (f" (n={ln.n})" if ln.n else ""))
            if not math.isfinite(ln.diff):
                ax.text(0.5, yi, f"no figure: {ln.missing or '?'}", ha="center", va="center", fontsize=7,
                        color="#57606a", transform=ax.get_yaxis_transform())
                continue
            color = _color(0) if ln.sign > 0 else _color(1) if ln.sign < 0 else "#57606a"
            if math.isfinite(ln.low) and math.isfinite(ln.high):
                ax.hlines(yi, min(ln.low, ln.high), max(ln.low, ln.high), color=color, lw=2)
            ax.plot([ln.diff], [yi], "s", ms=6, color=color)
        ax.axvline(0.0, color="black", lw=0.8, ls="--")
        ax.set_yticks(y, labels)
        ax.set_ylim(-0.7, len(lines) - 0.3)
        ax.set_xlabel(f"difference {pair.challenger} − {pair.reference} (each on its own scale)")
        ax.set_title(f"{pair.challenger} vs {pair.reference}: {pair.verdict()}", fontsize=8)
        return _svg(fig)


def _table(head: common.Row, rows: Sequence[common.Row], *, marks: bool = False) -> str:
    def cell(text: str) -> str:
        esc = html.escape(text).replace("\n", "<br>")
        if marks and text.startswith("FAIL"):
            return f'<td class="fail">{esc}</td>'
        if marks and text.startswith("PASS"):
            return f'<td class="pass">{esc}</td>'
        return f"<td>{esc}</td>"

    out = ["<table><thead><tr>", *[f"<th>{html.escape(h)}</th>" for h in head], "</tr></thead><tbody>"]
    for r in rows:
        out += ["<tr>", *[cell(c) for c in r], "</tr>"]
    out.append("</tbody></table>")
    return "".join(out)


def _plot(svg: str | None) -> str:
    return f'<div class="plot">{svg}</div>' if svg else ""


def verdict_html(report: Report) -> str:
    """The verdict block, first under the title: the headline, every finding, what was not decided and what would."""
    headline, findings, undecided = common.verdict_parts(report)
    out = ['<div class="verdict"><h2>Verdict</h2>', f'<p class="headline"><strong>{html.escape(headline)}</strong></p>']
    if findings:
        out += ["<ul>", *[f"<li>{html.escape(f)}</li>" for f in findings], "</ul>"]
    if undecided:
        out += ["<p>Could not decide (and what would decide it):</p><ul>",
                *[f"<li>{html.escape(u)}</li>" for u in undecided], "</ul>"]
    out += [f'<p class="note">{html.escape(common.VERDICT_NOTE)}</p></div>']
    return "".join(out)


_H2 = re.compile(r"<h2>(.*?)</h2>", re.S)


def _with_contents(body: str) -> tuple[str, str]:
    """``body`` with an anchor before each ``<h2>``, and the table of contents linking to them."""
    entries: list[tuple[str, str]] = []
    used: set[str] = set()

    def anchor(m: re.Match[str]) -> str:
        title = re.sub(r"<[^>]+>", "", m.group(1))
        slug = re.sub(r"[^a-z0-9]+", "-", html.unescape(title).lower()).strip("-") or "section"
        base, i = slug, 2
        while slug in used:
            slug, i = f"{base}-{i}", i + 1
        used.add(slug)
        entries.append((slug, title))
        return f'<a id="{slug}"></a>{m.group(0)}'

    body = _H2.sub(anchor, body)
    toc = ('<nav class="toc"><strong>Contents</strong><ol>'
           + "".join(f'<li><a href="#{slug}">{title}</a></li>' for slug, title in entries) + "</ol></nav>")
    return body, toc


def render_html(report: Report) -> str:
    """The whole report as one HTML document (a string): the verdict first, then a table of contents."""
    preamble = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
                "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
                "<title>ubi report</title><style>", _CSS, "</style></head><body>", "<h1>ubi report</h1>"]
    parts = [verdict_html(report)]
    parts += [f'<p class="meta">{html.escape(line)}</p>' for line in common.header_lines(report)]
    if report.warnings:
        parts += ["<h2>Data-quality warnings</h2>", "<ul>",
                  *[f'<li class="warn">{html.escape(w)}</li>' for w in report.warnings], "</ul>"]
    if report.gates:
        failed = report.failed_gates
        verdict = (f'<p class="fail">{len(failed)} gate(s) failed</p>' if failed
                   else '<p class="pass">all gates passed</p>')
        parts += ["<h2>Gates</h2>", verdict, _table(*common.gates_table(report), marks=True)]
    parts += [f"<h2>{html.escape(common.systems_title(report))}</h2>", _table(*common.systems_table(report))]
    parts += ["<h2>Offline metrics</h2>", '<div class="plots">']
    parts += [_plot(metric_bars_svg(report, s)) for s in report.sources]
    parts.append("</div>")
    for source, head, rows in common.offline_tables(report):
        parts += [f"<h3>{html.escape(source)} labels</h3>", _table(head, rows)]
    for source, head, rows in common.class_tables(report):
        parts += [f"<h3>By query class ({html.escape(source)})</h3>", _table(head, rows)]
    parts += ["<h3>Labels and coverage</h3>", _table(*common.labels_table(report))]
    if report.merge is not None:
        parts += ['<p class="note">Merged view: every label is kept and the precedence picks one per pair; each '
                  "pair with all its labels and their provenance is in the JSON report.</p>",
                  _table(*common.merge_table(report))]
    parts.append(_table(*common.coverage_table(report)))
    if report.online:
        left = common.left_out_note(report)
        parts += ["<h2>Online metrics</h2>", '<div class="plots">', _plot(ctr_by_rank_svg(report)),
                  _plot(propensity_svg(report.propensity)), "</div>", _table(*common.online_table(report)),
                  f'<p class="note">{html.escape(left)}</p>' if left else ""]
    if report.interleaving:
        parts += ["<h2>Interleaving (team draft)</h2>",
                  '<p class="note">The challenger against the reference: each click credits the ranker that '
                  "contributed the result; per search and per query, wins, losses and ties, the win rate "
                  "wins / (wins + losses) with a bootstrap interval and the exact sign test.</p>",
                  _table(*interleaving.table(report.interleaving))]
    if report.predicted:
        parts += ["<h2>Predicted online metrics (run systems, never served)</h2>",
                  f'<p class="note">{html.escape(common.predicted_title(report))}.</p>',
                  _table(*common.predicted_table(report)),
                  f'<p class="note">{html.escape(common.predicted_note(report))}</p>']
    if report.pairs:
        parts += ["<h2>Joint view: each pair of systems</h2>", f'<p class="note">{html.escape(common.JOINT_NOTE)}</p>']
        for pair, (title, head, rows, verdict) in zip(report.pairs, common.pair_tables(report), strict=True):
            parts += [f"<h3>{html.escape(title)}</h3>", '<div class="plots">', _plot(forest_svg(pair)), "</div>",
                      _table(head, rows), f"<p><strong>{html.escape(verdict)}</strong></p>"]
    if report.agreement:
        parts += [f"<h2>{html.escape(common.agreement_title(report))}</h2>", _table(*common.agreement_table(report)),
                  *[f'<p class="note">{html.escape(common.no_overlap(report, s) or "")}</p>'
                    for s in report.agreement if common.no_overlap(report, s)],
                  '<div class="plots">',
                  *[_plot(confusion_svg(report, s)) for s in report.agreement if not common.no_overlap(report, s)],
                  "</div>"]
    if report.assessors is not None:
        parts += [f"<h2>{common.ASSESSORS_TITLE}</h2>", f'<p class="note">{html.escape(common.assessor_line(report))}</p>',
                  _table(*common.kappa_table(report)), f"<h3>{html.escape(common.disputed_title(report))}</h3>",
                  _table(*common.disputed_table(report)) if report.assessors.disputed else "<p>none</p>"]
    if report.comparisons:
        parts += [f"<h2>Against the baseline {html.escape(report.comparisons[0].baseline)}</h2>",
                  '<p class="note">Paired on common queries; Holm-adjusted over every comparison; * = significant '
                  "at 0.05 (randomisation test).</p>"]
        for title, head, rows in common.comparison_tables(report):
            parts += [f"<h3>{html.escape(title)}</h3>", _table(head, rows)]
    if report.orderings:
        parts += ["<h2>Offline vs online ordering</h2>", _table(*common.order_table(report)),
                  _table(*common.ordering_table(report))]
    if report.notes:
        parts += ["<h2>Notes</h2>", "<ul>", *[f"<li class=\"note\">{html.escape(n)}</li>" for n in report.notes], "</ul>"]
    parts += [f'<p class="meta">{html.escape(common.summary_line(report))}</p>', "</body></html>\n"]
    body, toc = _with_contents("".join(parts))
    # the verdict block is the body's first part: the contents come right after it
    cut = body.index("</div>", body.index('class="verdict"')) + len("</div>")
    return "".join(preamble) + body[:cut] + toc + body[cut:]
