"""The report as rich terminal tables."""

from __future__ import annotations

import io

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ubi_pipeline.reports import interleaving
from ubi_pipeline.reports.joint import Report
from ubi_pipeline.reports.render import common
from ubi_pipeline.schemas.terminal import printable


def _shown(text: str) -> str:
    """Stored text as a terminal shows it safely: rich markup escaped, terminal escape sequences removed
    (``ubi_pipeline.schemas.terminal.printable``): system names and queries are producers' text."""
    return escape(printable(text))

def _table(title: str, head: common.Row, rows: list[common.Row], *, wrap_last: int | None = None) -> Table:
    # every string is escaped: system names, sources and queries are user text, and rich would take a
    # "[min]" or "[ranker=a]" in them for markup and drop it
    t = Table(title=_shown(title), title_justify="left", show_lines=False, header_style="bold")
    for i, h in enumerate(head):
        numeric = i > 0 and all(not r[i] or r[i][0] in "0123456789+-–<" for r in rows)
        # a column of sentences (why a line has no figure, which traffic an A/B rests on) wraps instead of widening
        # the table past a screen
        limit = wrap_last if i == len(head) - 1 else None
        t.add_column(_shown(h), justify="right" if numeric else "left", overflow="fold", max_width=limit)
    for r in rows:
        t.add_row(*[_shown(c) for c in r])
    return t


def print_report(report: Report, console: Console) -> None:
    """Print every section of the report to ``console``."""
    if console.is_terminal:
        console.rule("[bold]ubi report")
    else:  # a rule spans the whole (log-wide) width
        console.print("== ubi report ==", highlight=False)
    headline, findings, undecided = common.verdict_parts(report)
    console.print(f"[bold]Verdict:[/] {_shown(headline)}", highlight=False)
    for line in findings:
        console.print(f"  - {_shown(line)}", highlight=False)
    if undecided:
        console.print("[bold]Could not decide[/] (and what would decide it):", highlight=False)
        for line in undecided:
            console.print(f"  - {_shown(line)}", highlight=False)
    console.print(f"[dim]{_shown(common.VERDICT_NOTE)}[/]", highlight=False)
    for line in common.header_lines(report):
        console.print(_shown(line), highlight=False)
    for warning in report.warnings:
        console.print(f"[bold yellow]warning:[/] {_shown(warning)}", highlight=False)
    console.print(_table(common.systems_title(report), *common.systems_table(report)))
    console.print(_table("Labels by source", *common.labels_table(report)))
    if report.merge is not None:
        console.print(_table("Merged view of the labels (every label kept; per pair in the JSON report)",
                             *common.merge_table(report)))
    console.print(_table(common.coverage_title(report), *common.coverage_table(report)))
    for source, head, rows in common.offline_tables(report):
        console.print(_table(f"Offline metrics against {source} labels (mean [CI], over "
                             f"{common.unit(report)} with a positive)", head, rows))
    for source, head, rows in common.class_tables(report):
        console.print(_table(f"By query class ({source})", head, rows))
    if report.online:
        console.print(_table("Online metrics from the event log (value [CI])", *common.online_table(report)))
        left = common.left_out_note(report)
        if left:
            console.print(f"[dim]{_shown(left)}[/]", highlight=False)
    if report.interleaving:
        console.print(_table("Interleaving (team draft): the challenger against the reference",
                             *interleaving.table(report.interleaving)))
    if report.predicted:
        console.print(_table(common.predicted_title(report), *common.predicted_table(report)))
        console.print(f"[dim]{_shown(common.predicted_note(report))}[/]", highlight=False)
    if report.pairs:
        console.print(_shown("Joint view: every kind of evidence on each pair of systems (challenger − reference)"),
                      highlight=False)
        for title, head, rows, verdict in common.pair_tables(report):
            console.print(_table(title, head, rows, wrap_last=60))
            console.print(_shown(f"{title}: {verdict}"), highlight=False)
        console.print(f"[dim]{_shown(common.JOINT_NOTE)}[/]", highlight=False)
    if report.agreement:
        console.print(_table(common.agreement_title(report), *common.agreement_table(report)))
        for source in report.agreement:
            empty = common.no_overlap(report, source)
            if empty:
                console.print(_shown(empty), highlight=False)
            else:
                console.print(_table(f"Confusion matrix: {source}", *common.confusion_rows(report, source)))
    if report.assessors is not None:
        console.print(_shown(f"{common.ASSESSORS_TITLE}: {common.assessor_line(report)}"), highlight=False)
        console.print(_table(f"{common.ASSESSORS_TITLE}: Cohen's kappa of each couple", *common.kappa_table(report)))
        if report.assessors.disputed:
            console.print(_table(common.disputed_title(report), *common.disputed_table(report), wrap_last=60))
        else:
            console.print(_shown(f"{common.disputed_title(report)}: none"), highlight=False)
    for title, head, rows in common.comparison_tables(report):
        console.print(_table(f"{title} (paired; Holm over every comparison; * = significant at 0.05)", head, rows))
    if report.orderings:
        console.print(_table("Order of the systems", *common.order_table(report)))
        console.print(_table("Offline vs online order: rank correlation", *common.ordering_table(report)))
    if report.gates:
        console.print(_table("Gates", *common.gates_table(report)))
    for note in report.notes:
        console.print(f"[dim]note: {_shown(note)}[/]", highlight=False)
    console.print(_shown(common.summary_line(report)), highlight=False)


def render_text(report: Report, *, width: int = 10_000, color: bool = False) -> str:
    """The terminal report as plain text (for ``--out``): tables at their natural width, lines never wrapped."""
    buf = io.StringIO()
    print_report(report, Console(file=buf, width=width, force_terminal=color, color_system=None if not color else "auto"))
    return buf.getvalue()
