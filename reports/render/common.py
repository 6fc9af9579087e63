"""Formatting shared by the text, Markdown and HTML renderers: the same rows, the same numbers."""

from __future__ import annotations

import math
from collections.abc import Iterator

from ubi_pipeline.reports.compare import Ordering
from ubi_pipeline.reports.intervals import MIN_BOOTSTRAP_N, Interval, why_no_interval
from ubi_pipeline.reports.joint import NO_LOG, Report
from ubi_pipeline.reports.pairs import PairView

Row = list[str]
NO_COMMON = "no common queries"


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
    """``0.268 [0.190, 0.350]``; the bare value and why when n does not allow an interval
    (:func:`ubi_pipeline.reports.intervals.why_no_interval`: ``0.744 (no interval: n = 1: no spread to estimate)``)."""
    if iv is None or not math.isfinite(iv.value):
        return "–"
    why = why_no_interval(iv)
    if why is not None:
        return num(iv.value, digits) + ("" if why == "no interval" else f" (no interval: {why})")
    return f"{num(iv.value, digits)} [{num(iv.low, digits)}, {num(iv.high, digits)}]"


def verdict_parts(report: Report) -> tuple[str, list[str], list[str]]:
    """(headline, one line per finding, one line per thing the report could not decide with what would decide it)."""
    v = report.verdict
    if v is None:
        return "no verdict (nothing was compared)", [], []
    return v.headline, [f.text for f in v.findings], list(v.undecided)


VERDICT_NOTE = ("A line of evidence counts when its interval excludes 0 (none below n = 5); a predicted line only when "
                "no document of either top k rests on the click model's prior; a never-served candidate is ordered "
                "against a logged system only when its primary (calibrated) interval and the logged interval are "
                "disjoint. Anything else is undetermined.")


def unit(report: Report) -> str:
    """What one evaluated row of a system is: ``queries`` (mode modal) or ``searches`` (mode each)."""
    return "searches" if report.config.mode == "each" else "queries"


def header_lines(report: Report) -> list[str]:
    cfg = report.config
    lines = [f"created {report.created_at.isoformat()}"]
    for key in ("db", "qrels", "rating_map", "queries", "thresholds"):
        if report.inputs.get(key):
            lines.append(f"{key}: {report.inputs[key]}")
    for run in report.inputs.get("runs") or ():
        lines.append(f"run: {run}")
    lines.append(
        f"k={cfg.k}, gain={cfg.gain}, positive = grade >= {cfg.rel_threshold}, repeated searches: {cfg.mode} "
        f"({'most frequent ranking per query' if cfg.mode == 'modal' else 'every search on its own'}), "
        f"intervals: {int(cfg.confidence * 100)}% where n allows (none for n = 1; a bootstrap needs n >= "
        f"{MIN_BOOTSTRAP_N}), seed {cfg.seed}"
    )
    if report.identifiability is not None:
        lines.append(f"identifiability: {report.identifiability['verdict']} ({report.identifiability['reason']})")
    rec = report.recommendation
    if rec is not None:
        lines.append(f"recommended implicit source: {rec['source']} ({rec['why']})" if rec["source"] else
                     f"recommended implicit source: {rec['why']}" if rec["why"].startswith("no recommendation") else
                     f"recommended implicit source: none ({rec['why']})")
        for source, why in rec["not_recommended"].items():
            lines.append(f"not recommended: {source} ({why})")
    return lines


def systems_title(report: Report) -> str:
    return "Systems in the logs and run files" if report.run_systems else "Systems in the logs"


def coverage_title(report: Report) -> str:
    return "Coverage of each system's top k" if report.run_systems else "Coverage of the logged top k"


def _count(value: int | None) -> str:
    return NO_LOG if value is None else str(value)


def systems_table(report: Report) -> tuple[Row, list[Row]]:
    """A row per fact, a column per system (system names are long; facts are few)."""
    systems = report.systems
    facts = [
        ("searches", lambda s: _count(s.searches)),
        ("queries with a ranking", lambda s: str(s.queries)),
        ("searches without ranking", lambda s: _count(s.unranked_searches)),
        ("zero-result searches", lambda s: _count(s.zero_result_searches)),
        ("searches with several rankings", lambda s: _count(s.searches_with_several_rankings)),
        ("queries shown several rankings", lambda s: _count(s.unstable_queries)),
        ("mean share of the modal ranking", lambda s: NO_LOG if s.from_run else num(s.mean_modal_share, 2)),
    ]
    if report.run_systems:
        facts.insert(0, ("from", lambda s: f"run file {s.origin}" if s.from_run else "logs"))
    return ["", *[s.name for s in systems]], [[name, *[f(s) for s in systems]] for name, f in facts]


def labels_table(report: Report) -> tuple[Row, list[Row]]:
    """(query, doc) pairs per source (a pair several assessors graded counts once; their rows are the labels
    column), and how many pairs the merged view takes from each."""
    chosen = report.merge.chosen_by_source if report.merge is not None else {}
    head = ["source", "pairs", "graded pairs", "labels (one per assessor)", "queries", "pairs chosen by the merge"]
    rows = [[s, str(c["pairs"]), str(c["graded_pairs"]), str(c["labels"]), str(c["queries"]), str(chosen.get(s, 0))]
            for s, c in report.label_counts.items()]
    return head, rows


def merge_table(report: Report) -> tuple[Row, list[Row]]:
    """The merged view in numbers: precedence, pairs, conflicts (per disagreeing couple of sources)."""
    m = report.merge
    if m is None:
        return ["merged view", ""], []
    rows = [
        ["precedence", " > ".join(m.precedence)],
        ["labelled (query, doc) pairs", str(m.pairs)],
        ["pairs with labels of several sources", str(m.several_sources)],
        ["pairs whose graded labels disagree", str(m.conflicts)],
    ]
    rows += [[f"disagree: {couple}", str(n)] for couple, n in m.conflicts_by_sources.items()]
    rows.append(["pairs without a graded label the precedence names (not in the merged view)", str(m.unresolved)])
    return ["merged view", ""], rows


def coverage_table(report: Report) -> tuple[Row, list[Row]]:
    """judged@k of each system's logged top k per label source (labelled queries of the run in brackets)."""
    systems = [s.name for s in report.systems]
    cells = {(c.system, c.source): c for c in report.coverage}
    sources = list(dict.fromkeys(c.source for c in report.coverage))
    abbr = "s" if unit(report) == "searches" else "q"  # labelled / all rows of the run
    rows = []
    for source in sources:
        row = [source]
        for system in systems:
            c = cells.get((system, source))
            row.append("–" if c is None else f"{num(c.judged_at_k)} ({c.queries_labelled}/{c.queries} {abbr})")
        rows.append(row)
    return [f"judged@{report.config.k}", *systems], rows


def offline_tables(report: Report) -> Iterator[tuple[str, Row, list[Row]]]:
    """One table per judgment source: a row per metric, a column per system (mean [CI])."""
    metrics = report.config.metric_names
    for source in report.sources:
        results = [r for r in report.offline if r.source == source]
        head = ["", *[r.system for r in results]]
        # mode each scores every search on its own, so these count searches, not distinct queries
        each = unit(report) == "searches"
        rows = [["searches evaluated" if each else "queries evaluated", *[str(r.n_queries) for r in results]]]
        rows += [[m, *[ci(r.aggregate.get(m)) for r in results]] for m in metrics]
        rows.append(["labelled-negative searches" if each else "labelled negatives",
                     *[str(len(r.negatives)) for r in results]])
        rows.append(["unlabelled searches" if each else "unlabelled run queries",
                     *[str(r.unlabelled_queries) for r in results]])
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
            yield source, ["system", "class", unit(report), *metrics], rows


def online_table(report: Report) -> tuple[Row, list[Row]]:
    """A row per online metric, a column per system: value [CI] (n searches, results or clicks).

    Run-file systems get a column of "no log": they were never shown to users, which is not a zero.
    """
    online = report.online
    systems = [*online, *[s for s in report.run_systems if s not in online]]
    first = next(iter(online.values()), None)
    names = list(first.metrics) if first is not None else []

    def cell(system: str, metric: str) -> str:
        if system not in online:
            return NO_LOG
        iv = online[system].metrics[metric]
        return f"{ci(iv)} (n={iv.n})"

    rows = [["searches", *[str(online[s].searches) if s in online else NO_LOG for s in systems]]]
    if any(om.left_out for om in online.values()):
        rows.append(["left out (session filter)", *[_left_out(online[s].left_out) if s in online else NO_LOG
                                                    for s in systems]])
    rows += [[n, *[cell(s, n) for s in systems]] for n in names]
    return ["", *systems], rows


def _left_out(counts: dict[str, int]) -> str:
    """``251 (bot 151, click_all 100)``: the searches the session filter dropped, by reason."""
    total = sum(counts.values())
    return "0" if not total else f"{total} (" + ", ".join(f"{r} {n}" for r, n in sorted(counts.items())) + ")"


def left_out_note(report: Report) -> str | None:
    """One sentence under the online table: how many searches the session filter left out per system."""
    counts = {s: om.searches_left_out for s, om in report.online.items()}
    if not any(counts.values()):
        return None
    return ("Left out of every online figure, the A/B lines and the prediction baselines, as `ubi process` leaves them "
            "out of the judgments (bots, searches with a click on every result, empty queries): "
            + ", ".join(f"{s} {n}" for s, n in counts.items()) + " searches; 'searches' counts the searches kept.")


def _kind(source: str) -> str:
    """``implicit`` or ``model``: the kind of label a measured source is (``implicit:pbm``, ``model:gpt-4o-mini``)."""
    return source.split(":", 1)[0]


def agreement_title(report: Report) -> str:
    """The agreement table's title, naming the kinds of source it measures (model judges sit beside click models,
    and a title that says "implicit" over a ``model:*`` row misnames it)."""
    kinds = list(dict.fromkeys(_kind(s) for s in report.agreement))
    return f"Agreement of {' and '.join(kinds) or 'implicit'} labels with human grades"


def agreement_table(report: Report) -> tuple[Row, list[Row]]:
    head = ["source", "pairs", "excluded (calibration)", "kappa (quadratic)", "Spearman", "Kendall"]
    rows = [[s, str(a.pairs), str(a.excluded_calibration), num(a.kappa), num(a.spearman), num(a.kendall)]
            for s, a in report.agreement.items()]
    return head, rows


ASSESSORS_TITLE = "Agreement among assessors"


def assessor_line(report: Report) -> str:
    """One sentence: Krippendorff's alpha over every assessor, what it rests on, and how pairs are merged."""
    a = report.assessors
    if a is None:
        return ""
    return (f"Krippendorff's alpha ({a.alpha_metric} metric) {ci(a.alpha)} over {a.pairs_several:,} (query, doc) pairs "
            f"graded by two or more of {len(a.assessors)} assessors ({a.pairs_graded:,} pairs graded in all); "
            f"95% bootstrap intervals over pairs. The merged human grade of a pair is the {_RULE.get(a.aggregate_rule, a.aggregate_rule)} "
            "of its assessors' grades; each implicit or model source's agreement with human grades is measured on "
            "it, and the assessors' own agreement is the ceiling to read that against.")


_RULE = {"median_low": "lower median"}


def kappa_table(report: Report) -> tuple[Row, list[Row]]:
    """Cohen's kappa (quadratic weights) of each couple of assessors on the pairs both graded."""
    a = report.assessors
    head = ["assessor", "assessor", "pairs both graded", "kappa (quadratic) [95% CI]"]
    rows = [] if a is None else [[k.assessor_a, k.assessor_b, str(k.kappa.n), ci(k.kappa)] for k in a.kappas]
    return head, rows


def disputed_title(report: Report) -> str:
    a = report.assessors
    if a is None:
        return ""
    shown = f", the {len(a.disputed)} widest shown" if a.disputed_total > len(a.disputed) else ""
    n = a.disputed_total
    return f"Disputed pairs: assessors {a.dispute_span} or more grades apart ({n:,} pair{'' if n == 1 else 's'}{shown})"


def disputed_table(report: Report) -> tuple[Row, list[Row]]:
    a = report.assessors
    head = ["query", "doc", "grades", "merged", "notes"]
    rows = [] if a is None else [
        [d.query, d.doc_id, ", ".join(f"{w} {g}" for w, g in d.grades.items()), str(d.aggregate),
         "; ".join(f"{w}: {n}" for w, n in d.notes.items())]
        for d in a.disputed]
    return head, rows


def no_overlap(report: Report, source: str) -> str | None:
    """What to say instead of a confusion matrix of zeros: no pair has both a graded label and a human one."""
    a = report.agreement[source]
    if a.pairs > 0:
        return None
    excluded = f" ({a.excluded_calibration} held back as calibration pairs)" if a.excluded_calibration else ""
    return f"{source}: {no_overlap_reason(source)}{excluded}, so there is no confusion matrix"


def no_overlap_reason(source: str) -> str:
    """Why a source has no agreement figures: none of its graded labels is on a pair people graded."""
    return f"no {_kind(source)} label overlaps a human one"


def confusion_rows(report: Report, source: str) -> tuple[Row, list[Row]]:
    a = report.agreement[source]
    head = [f"human \\ {source}", *[str(g) for g in a.grades]]
    return head, [[str(g), *[str(v) for v in row]] for g, row in zip(a.grades, a.confusion, strict=True)]


def comparison_tables(report: Report) -> Iterator[tuple[str, Row, list[Row]]]:
    """One table per system compared with the baseline: a row per (labels, metric)."""
    systems = list(dict.fromkeys(c.system for c in report.comparisons))
    head = ["labels · metric", "queries", "Δ mean [CI]", "t-test p", "rand. p", "Holm p", "W/L/T"]
    for system in systems:
        rows = []
        for c in report.comparisons:
            if c.system != system:
                continue
            if c.queries == 0:  # the two systems share no evaluated query: nothing to pair, not a zero
                rows.append([f"{c.source} · {c.metric}", "0", NO_COMMON, "–", "–", "–", "–"])
                continue
            diff = "–"
            if math.isfinite(c.diff):
                why = why_no_interval(Interval(c.diff, c.diff_low, c.diff_high, c.queries, "bootstrap"))
                diff = f"{c.diff:+.3f} " + (f"(no interval: {why})" if why else f"[{num(c.diff_low)}, {num(c.diff_high)}]")
            mark = " *" if c.significant() else ""
            rows.append([f"{c.source} · {c.metric}", str(c.queries), diff, pval(c.t_p), pval(c.randomisation_p),
                         pval(c.randomisation_p_holm) + mark, f"{c.wins}/{c.losses}/{c.ties}"])
        yield f"{system} − {report.comparisons[0].baseline}", head, rows


def order_table(report: Report) -> tuple[Row, list[Row]]:
    """Systems best first by each offline and online metric used in the orderings (each over every system
    that has the metric, so the orders may hold different systems)."""
    seen: dict[str, str] = {}
    for o in report.orderings:
        seen.setdefault(o.offline_metric, _offline_order(o))
        seen.setdefault(o.online_metric, " > ".join(o.online_order) or "–")
    rows = [[m, order] for m, order in seen.items()]
    runs = [s for s in report.run_systems if any(s in o.offline_order for o in report.orderings)]
    if runs:
        rows.append([f"not in the online orders ({NO_LOG})", ", ".join(runs)])
    return ["metric", "systems, best first"], rows


def _offline_order(o: Ordering) -> str:
    """The offline order with the queries it rests on; never an order of systems measured on different queries."""
    if o.offline_note:
        return o.offline_note
    if not o.offline_order:
        return "–"
    n = o.offline_queries
    if len(o.offline_order) == 1:
        return f"{o.offline_order[0]} only ({n} quer{'y' if n == 1 else 'ies'}; no other system has a labelled query)"
    return " > ".join(o.offline_order) + f" (on the {n} queries they share)"


def ordering_table(report: Report) -> tuple[Row, list[Row]]:
    """Rank correlation between each offline and online ordering, on the systems in both orders."""
    head = ["offline metric", "online metric", "systems in both", "Kendall", "Spearman"]
    rows = []
    for o in report.orderings:
        both = f"{o.systems} ({', '.join(o.common)})" if o.common else "0"
        if o.systems < 2:
            both += ": too few to correlate"
        elif o.systems == 2:
            both += ": can only be ±1"
        rows.append([o.offline_metric, o.online_metric, both, num(o.kendall), num(o.spearman)])
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
    n_run = len(report.run_systems)
    runs = f" ({n_run} from run files)" if n_run else ""
    failed = report.failed_gates
    gate = "" if not report.gates else (f"; gates: {len(failed)} failed" if failed else "; gates: all passed")
    return f"{n_sys} system(s){runs}, sources: {', '.join(report.sources) or 'none'}{gate}"


# ------------------------------------------------------------------ predicted online metrics, the joint view

PREDICTED_METRICS = ("ctr@k", "clicks_per_search", "abandonment", "rr_first_click")


def _calibrated(report: Report) -> bool:
    """Whether the predictions carry a calibrated interval (``Figure.cal_low``, from predictors that give one)."""
    return any(math.isfinite(getattr(f, "cal_low", math.nan)) for p in report.predicted if p.prediction is not None
               for figs in p.prediction.figures.values() for f in figs.values())


def predicted_title(report: Report) -> str:
    reps = report.config.predict_replicates
    cal = " {primary}" if _calibrated(report) else ""
    return (f"Predicted online metrics of the run systems (never served): value [95% bootstrap, {reps} "
            f"replicates]{cal} <prior-free>; the logged systems observed")


def predicted_note(report: Report) -> str:
    """What the predicted figures rest on, said once under the table."""
    reps = report.config.predict_replicates
    return (f"Predicted from the logs with {report.config.predict_model} ({reps} bootstrap replicates, each refitting "
            f"the model; `ubi report --predict-replicates N` for more, `ubi predict` uses 200). The bootstrap "
            "interval holds the sampling error, not the bias of the model or of documents the log never showed: "
            "read the prior share beside it, and the prior-free interval, in which those documents may take any "
            "click probability. \"model, θ\": the click model, and where IPS took its propensities from (pbm: "
            "the PBM fit; randomized: the log's swap experiment)." + (
                " {primary}: the predictor's primary interval, each document the log never showed ranging over what "
                "its evidence allows (human grades, the hit lists below the displayed depth, the run's scores, else "
                "every deep pair's click probability; see `ubi predict --help`)." if _calibrated(report) else ""))


def predicted_table(report: Report) -> tuple[Row, list[Row]]:
    """A row per run system and method, then a row per logged system (observed); a column per metric."""
    k = report.config.k
    names = [m.replace("@k", f"@{k}") for m in PREDICTED_METRICS]
    head = ["system", "method", "searches", *names, "prior share", "model, θ"]
    rows = []
    for p in report.predicted:
        pred = p.prediction
        if pred is None:
            rows.append([p.system, "–", "–", *["–"] * len(names), "–", f"no prediction: {p.error}"])
            continue
        for method, figs in pred.figures.items():
            cells = []
            for m in PREDICTED_METRICS:
                f = figs.get(m)
                if f is None:
                    cells.append("n/a")
                    continue
                cal_low, cal_high = getattr(f, "cal_low", math.nan), getattr(f, "cal_high", math.nan)
                cal = f"\n{{{num(cal_low)}, {num(cal_high)}}}" if math.isfinite(cal_low) else ""
                free = f"\n<{num(f.bound_low)}, {num(f.bound_high)}>" if math.isfinite(f.bound_low) else ""
                cells.append(f"{num(f.value)} [{num(f.low)}, {num(f.high)}]{cal}{free}")
            shares = getattr(pred, "evidence_shares", None)  # per kind of evidence, when the predictor gives them
            extra = "".join(f"\n{kind} {num(v * 100, 1)}%" for kind, v in shares.items()) if shares else ""
            rows.append([p.system, method, f"{pred.searches} of {pred.logged_searches}", *cells,
                         f"{num(pred.prior_share * 100, 1)}%{extra}", f"{pred.model}, {pred.propensity}"])
    for system, om in report.online.items():
        cells = []
        for m in names:
            iv = om.metrics.get(m)
            cells.append("–" if iv is None else ci(iv))
        rows.append([system, "observed", str(om.searches), *cells, "–", "logged"])
    return head, rows


def _diff(x: float) -> str:
    return "–" if not math.isfinite(x) else f"{x:+.3f}"


def pair_title(pair: PairView) -> str:
    return f"{pair.challenger} − {pair.reference}"


def _count_unit(n: int | None, unit: str) -> str:
    if n == 1 and unit.startswith("queries"):
        unit = "query" + unit[len("queries"):]
    return f"{n} {unit}"


def pair_tables(report: Report) -> Iterator[tuple[str, Row, list[Row], str]]:
    """One table per pair of systems: a row per line of evidence (challenger − reference), then the signs of the
    lines and the pair's outcome in the report's verdict (``ubi_pipeline.reports.verdict``)."""
    head = ["evidence", "measure", "difference [95% CI]", "n", "sign", "excludes 0", "interval, or why none"]
    outcomes = {(f.reference, f.challenger): f.text for f in (report.verdict.findings if report.verdict else ())
                if f.kind == "pair"}
    for pair in report.pairs:
        rows = []
        for ln in pair.lines:
            if ln.missing is not None and not math.isfinite(ln.diff):
                rows.append([ln.evidence, ln.measure, "–", "–" if ln.n is None else str(ln.n), "–", "–", ln.missing])
                continue
            bounds = (f" [{_diff(ln.low)}, {_diff(ln.high)}]" if math.isfinite(ln.low) and math.isfinite(ln.high)
                      else " (no interval)")
            sign = {1: "+", -1: "−", 0: "0"}[ln.sign]
            clear = {True: "yes", False: "no", None: "–"}[ln.clear]
            rows.append([ln.evidence, ln.measure, _diff(ln.diff) + bounds, _count_unit(ln.n, ln.unit), sign, clear,
                         ln.interval])
        outcome = outcomes.get((pair.reference, pair.challenger))
        yield (pair_title(pair), head, rows,
               f"signs of the lines: {pair.verdict()}" + (f". Outcome: {outcome}" if outcome else ""))


JOINT_NOTE = ("Each line is challenger − reference on its own scale (an nDCG difference, a CTR difference, a win "
              "rate minus 1/2), so only the signs are compared. Offline: paired over the queries both were "
              "evaluated on. Predicted: doubly robust CTR@k of both on the logged queries every system ranks, the "
              "same bootstrap resamples of the log for both (the model refitted on each); '≤ x% on the prior' is "
              "the larger share of the two top k that rests on the model's prior only; none when the identifiability "
              "verdict rules the click model out. Observed: logged CTR@k of both, MOVER interval of the difference "
              "(Newcombe 1998, method 10), only when the two served one application at overlapping times on shared "
              "queries (an A/B comparison; anything else compares different traffic); the session filter's searches "
              "left out. Interleaving: the challenger's win rate over searches with a winner, minus 1/2. No interval "
              "and no 'excludes 0' on fewer than 5 units. Systems whose searches were interleaved are a mix "
              "of two rankers and get no pair.")
