"""The report as GitHub-flavoured Markdown (for a CI job summary or a pull request comment)."""

from __future__ import annotations

from ubi_pipeline.reports import interleaving
from ubi_pipeline.reports.joint import Report
from ubi_pipeline.reports.render import common


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def _table(head: common.Row, rows: list[common.Row]) -> str:
    lines = ["| " + " | ".join(_escape(h) for h in head) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    lines += ["| " + " | ".join(_escape(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_markdown(report: Report) -> str:
    """Every section of the report as Markdown."""
    out = ["# ubi report", ""]
    headline, findings, undecided = common.verdict_parts(report)
    out += ["## Verdict", "", f"**{headline}**", ""] + [f"- {line}" for line in findings] + [""]
    if undecided:
        out += ["Could not decide (and what would decide it):", ""] + [f"- {line}" for line in undecided] + [""]
    out += [common.VERDICT_NOTE, ""]
    out += [f"- {line}" for line in common.header_lines(report)] + [""]
    if report.warnings:
        out += ["## Data-quality warnings", ""] + [f"- **warning:** {w}" for w in report.warnings] + [""]
    out += [f"## {common.systems_title(report)}", "", _table(*common.systems_table(report))]
    out += ["## Labels by source", "", _table(*common.labels_table(report))]
    if report.merge is not None:
        out += ["### Merged view", "", "Every label is kept; the precedence picks one per pair. Each pair with all "
                "its labels and their provenance is in the JSON report.", "", _table(*common.merge_table(report))]
    out += [f"## {common.coverage_title(report)}", "", _table(*common.coverage_table(report))]
    for source, head, rows in common.offline_tables(report):
        out += [f"## Offline metrics: {source} labels", "",
                f"Mean [CI] over the {common.unit(report)} with at least one positive label; labelled negatives "
                "apart.", "",
                _table(head, rows)]
    for source, head, rows in common.class_tables(report):
        out += [f"### By query class ({source})", "", _table(head, rows)]
    if report.online:
        out += ["## Online metrics", "", _table(*common.online_table(report))]
        left = common.left_out_note(report)
        if left:
            out += [left, ""]
    if report.interleaving:
        out += ["## Interleaving", "", _table(*interleaving.table(report.interleaving))]
    if report.predicted:
        out += ["## Predicted online metrics (run systems, never served)", "", common.predicted_title(report) + ".",
                "", _table(*common.predicted_table(report)), common.predicted_note(report), ""]
    if report.pairs:
        out += ["## Joint view: each pair of systems", "", common.JOINT_NOTE, ""]
        for title, head, rows, verdict in common.pair_tables(report):
            out += [f"### {title}", "", _table(head, rows), f"**{verdict}**", ""]
    if report.agreement:
        out += [f"## {common.agreement_title(report)}", "", _table(*common.agreement_table(report))]
        for source in report.agreement:
            empty = common.no_overlap(report, source)
            out += [f"### Confusion matrix: {source}", "",
                    *([empty, ""] if empty else [_table(*common.confusion_rows(report, source))])]
    if report.assessors is not None:
        out += [f"## {common.ASSESSORS_TITLE}", "", common.assessor_line(report), "", _table(*common.kappa_table(report)),
                f"### {common.disputed_title(report)}", ""]
        out += [_table(*common.disputed_table(report))] if report.assessors.disputed else ["none", ""]
    if report.comparisons:
        out += [f"## Against the baseline {report.comparisons[0].baseline}", "",
                "Paired on common queries; Holm-adjusted over every comparison; * = significant at 0.05 "
                "(randomisation test).", ""]
        for title, head, rows in common.comparison_tables(report):
            out += [f"### {title}", "", _table(head, rows)]
    if report.orderings:
        out += ["## Offline vs online ordering", "", _table(*common.order_table(report)),
                _table(*common.ordering_table(report))]
    if report.gates:
        out += ["## Gates", "", _table(*common.gates_table(report))]
    if report.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in report.notes] + [""]
    out += [common.summary_line(report), ""]
    return "\n".join(out)
