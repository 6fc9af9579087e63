"""Which implicit source to trust on this log, and why; and what the log cannot tell (identifiability).

Two checks on the stored implicit sources, both from the same sessions ``ubi process`` fits on:

* **Identifiability** (``ubi_pipeline.processors.clicks.identifiability.assess``, the verdict ``ubi process`` and
  ``ubi propensity`` use): when no (query, doc) pair was shown at two ranks, position-debiased sources
  (coec, pbm, ubm, dbn) cannot separate position from relevance. Their grades are not used by the report
  (rows made before the check may still carry some: they are set aside and counted in a note).
* **Recommendation**: the source whose model predicts held-out clicks best. ``implicit:auto`` rows carry the
  choice ``ubi process --model auto`` made per application and every model's held-out figures; for the
  other sources the report fits their models on the same deterministic split by query_id hash
  (``ubi_pipeline.processors.click_models.selection``) and compares their mean held-out conditional perplexity. Position-debiased
  sources are not recommended on a log that cannot identify them, nor is COEC
  (``ubi_pipeline.processors.click_models.selection.NOT_CANDIDATES``: its click predictions and its scores are different posteriors).
  Agreement with human grades, when there are any, is quoted beside the choice: held-out likelihood and agreement with labels do not always
  point the same way (Hager et al., SIGIR 2024), and the report shows both.
* **Support**: a choice is only made on enough evidence. The winner must rest on at least
  :data:`MIN_HELD_OUT_SEARCHES` held-out searches (all applications together) and grade at least
  :data:`MIN_GRADED_PAIRS` (query, doc) pairs; otherwise the report says "no recommendation", names the source
  that led and why it is not enough. On the ESCI sample the leader rested on 19 and 46 held-out searches
  and graded 4 of 1,004 pairs: no comparison of click models means anything there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ubi_pipeline.processors.click_models.selection import DEFAULT_HOLDOUT, Selection, select
from ubi_pipeline.processors.clicks.identifiability import (
    IDENTIFIED,
    UNIDENTIFIED,
    Identifiability,
    assess,
    is_position_debiased,
)
from ubi_pipeline.processors.clicks.sessions import SessionData
from ubi_pipeline.processors.labels.merge import Label, LabelSet, label_kind
from ubi_pipeline.reports.agreement import Agreement

AUTO_SOURCE = "implicit:auto"

#: Fewest held-out searches a recommendation rests on. Held-out perplexities of click models differ in the third
#: decimal (README, "Click models": 0.0017 between PBM variants at 2,000 searches), and the spread of a mean over
#: n searches shrinks as 1/sqrt(n): with 200 searches a model's mean held-out log-likelihood per search is known
#: to about 7% of one search's spread, already coarse beside differences that small. A choice, not a measurement:
#: below it the report says "no recommendation".
MIN_HELD_OUT_SEARCHES = 200
#: Fewest graded (query, doc) pairs of the recommended source: a source that grades a handful of pairs gives the
#: offline metrics nothing to rest on, however well its model predicts clicks (30: the usual floor for a
#: proportion's normal approximation, and six times the MIN_BOOTSTRAP_N queries an interval needs).
MIN_GRADED_PAIRS = 30


@dataclass(frozen=True)
class Recommendation:
    """The recommended implicit source (None: nothing to recommend) and the figures behind it."""

    source: str | None
    why: str
    held_out: dict[str, float] = field(default_factory=dict)  # source -> mean held-out conditional perplexity
    not_recommended: dict[str, str] = field(default_factory=dict)  # source -> why it was left out
    selections: list[dict[str, Any]] = field(default_factory=list)  # implicit:auto's per-application choices
    #: what the leading source rests on: held_out_searches, graded_pairs, labelled_pairs (None: not measured)
    support: dict[str, int] | None = None
    leader: str | None = None  # the source that led the comparison (== source unless support was too thin)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "why": self.why, "held_out_conditional_perplexity": self.held_out,
                "not_recommended": self.not_recommended, "selections": self.selections, "support": self.support,
                "leader": self.leader,
                "minimum_support": {"held_out_searches": MIN_HELD_OUT_SEARCHES, "graded_pairs": MIN_GRADED_PAIRS}}


def _supported(rec: Recommendation, labels: list[Label], held_out_searches: int) -> Recommendation:
    """``rec`` when its source rests on enough evidence (module docstring), else "no recommendation" and why."""
    if rec.source is None:
        return rec
    # counted, not collected: a source labels each (query, doc) pair once, and at 50M events the report holds
    # about 1M labels, whose pairs as sets of tuples would add some 150 MB to its peak
    n_pairs = n_graded = 0
    for lab in labels:
        if lab.source == rec.source:
            n_pairs += 1
            n_graded += lab.grade is not None
    support = {"held_out_searches": held_out_searches, "graded_pairs": n_graded, "labelled_pairs": n_pairs}
    short = []
    if held_out_searches < MIN_HELD_OUT_SEARCHES:
        short.append(f"its lead rests on {held_out_searches:,} held-out search{'es' if held_out_searches != 1 else ''} "
                     f"(at least {MIN_HELD_OUT_SEARCHES} needed)")
    if n_graded < MIN_GRADED_PAIRS:
        short.append(f"it grades {n_graded:,} of {n_pairs:,} pairs (at least {MIN_GRADED_PAIRS} needed)")
    if not short:
        return replace(rec, support=support, leader=rec.source)
    why = (f"no recommendation: {rec.source} led ({rec.why}), but {' and '.join(short)}; more logged traffic would "
           "decide")
    return replace(rec, source=None, why=why, support=support, leader=rec.source)


def _model_of(source: str) -> str:
    name = source.split(":", 1)[1]
    return "dctr" if name == "ctr" else name


def withhold_unidentified(labels: Iterable[Label], ident: Identifiability | None) -> tuple[list[Label], dict[str, int]]:
    """Labels with the grades of position-debiased sources removed when the log is ``unidentified``.

    Returns the labels and, per source, how many grades were set aside.
    """
    out: list[Label] = []
    dropped: dict[str, int] = {}
    withhold = ident is not None and ident.verdict == UNIDENTIFIED
    for lab in labels:
        out.append(_withheld(lab, dropped) if withhold else lab)
    return out, dropped


def _withheld(lab: Label, dropped: dict[str, int]) -> Label:
    """``lab`` without its grade if a position-debiased implicit source gave it (counted in ``dropped``)."""
    if lab.grade is not None and label_kind(lab.source) == "implicit" and is_position_debiased(lab.source):
        dropped[lab.source] = dropped.get(lab.source, 0) + 1
        return lab._replace(grade=None)
    return lab


def withhold_unidentified_in(labels: LabelSet, ident: Identifiability | None) -> dict[str, int]:
    """:func:`withhold_unidentified` applied to ``labels`` in place (each pair keeps its labels' order); returns
    the count per source. For a label set the caller owns: at 50M events a copy of about 1M labels would be
    held beside the original."""
    dropped: dict[str, int] = {}
    if ident is None or ident.verdict != UNIDENTIFIED:
        return dropped
    for labs in labels.by_pair.values():
        labs[:] = [_withheld(lab, dropped) for lab in labs]
    return dropped


def identifiability_notes(ident: Identifiability, sources: Iterable[str], dropped: Mapping[str, int]) -> list[str]:
    """One note per position-debiased source the verdict affects."""
    notes = []
    for source in sources:
        if not source.startswith("implicit:") or not is_position_debiased(source) or ident.verdict == IDENTIFIED:
            continue
        text = (f"{source} is position-debiased, and this log cannot separate position from relevance"
                + (" (no (query, doc) pair was shown at two ranks): it gives no grades"
                   if ident.verdict == UNIDENTIFIED else
                   f" beyond ranks {list(ident.linked_ranks)}: pairs shown only at ranks "
                   f"{list(ident.unlinked_ranks)} get no grade from it"))
        if dropped.get(source):
            text += f"; {dropped[source]:,} grades stored earlier were set aside"
        notes.append(text)
    return notes


def _auto_selections(labels: Iterable[Label]) -> list[dict[str, Any]]:
    seen: dict[Any, dict[str, Any]] = {}
    for lab in labels:
        if lab.source != AUTO_SOURCE or not lab.parameters:
            continue
        sel = lab.parameters.get("selection")
        if isinstance(sel, dict) and sel.get("application", "") not in seen:
            seen[sel.get("application", "")] = sel
    return [seen[k] for k in sorted(seen, key=lambda a: (a is None, str(a)))]


def _selection_text(sel: Mapping[str, Any]) -> str:
    held = sel.get("held_out") or {}
    chosen = sel.get("chosen")
    others = sorted(((v.get("conditional_perplexity"), m) for m, v in held.items()
                     if m != chosen and m not in (sel.get("excluded") or {}) and m not in ("gctr", "rctr")),
                    key=lambda x: (x[0] is None, x[0]))
    best = held.get(chosen, {}).get("conditional_perplexity")
    app = sel.get("application")
    text = f"{app + ': ' if app else ''}{chosen} (held-out conditional perplexity {best:.4f}" if best is not None \
        else f"{app + ': ' if app else ''}{chosen} ("
    if others and others[0][0] is not None:
        text += f", next {others[0][1]} {others[0][0]:.4f}"
    return text + f", {sel.get('test_sessions', 0):,} held-out searches)"


def held_out_selection(sources: Iterable[str], sessions: SessionData | None, ident: Identifiability | None,
                       *, holdout: float = DEFAULT_HOLDOUT) -> tuple[tuple[str, ...], Selection] | None:
    """The held-out fits :func:`recommend` compares the implicit ``sources`` by, as (their models, selection); None
    when it would fit nothing (no implicit source, ``implicit:auto`` among them, no held-out split, an empty side).

    The fits are the report's heaviest Python step (at 50M events about 0.9 GB above what is held), so the report
    runs them before it reads the labels and builds the runs, and hands the result to :func:`recommend`."""
    implicit = [s for s in sources if s.startswith("implicit:")]
    if not implicit or AUTO_SOURCE in implicit:
        return None
    if sessions is None or sessions.held_out is None or sessions.patterns.n_sessions == 0:
        return None
    models = tuple(dict.fromkeys(_model_of(s) for s in implicit))
    train, test = sessions.split()
    if train.n_sessions == 0 or test.n_sessions == 0:
        return None
    return models, select(train, test, models=list(models), identifiability=ident or assess(sessions.cells),
                          holdout=holdout, systems=sessions.systems)


def recommend(labels: Iterable[Label], sources: Iterable[str], sessions: SessionData | None,
              ident: Identifiability | None, agreement: Mapping[str, Agreement] | None = None,
              *, holdout: float = DEFAULT_HOLDOUT,
              selection: tuple[tuple[str, ...], Selection] | None = None) -> Recommendation | None:
    """The recommended implicit source (see the module docstring); None when the labels have no implicit source.

    ``selection``: :func:`held_out_selection` run earlier; used when it fitted exactly the models of these
    sources, else the fits are made here."""
    labels = list(labels)
    implicit = [s for s in sources if s.startswith("implicit:")]  # sources also hold "human", "merged", ...
    if not implicit:
        return None
    left_out: dict[str, str] = {}
    if ident is not None and ident.verdict != IDENTIFIED:
        for s in implicit:
            if is_position_debiased(s):
                left_out[s] = f"position not identifiable in this log ({ident.verdict})"
    agree = ""
    if agreement:
        ranked = sorted((a for s, a in agreement.items() if s in implicit and s not in left_out and a.pairs),
                        key=lambda a: -a.kappa)
        if ranked:
            agree = (f"; agreement with human grades: {ranked[0].source} best (quadratic kappa {ranked[0].kappa:.3f} "
                     f"on {ranked[0].pairs:,} pairs)")
    if AUTO_SOURCE in implicit:
        sels = _auto_selections(labels)
        why = ("chosen per application by held-out conditional perplexity (`ubi process --model auto`): "
               + "; ".join(_selection_text(s) for s in sels)) if sels else \
            "made by `ubi process --model auto` (its rows carry no selection figures)"
        searches = sum(int(s.get("test_sessions") or 0) for s in sels)
        return _supported(Recommendation(AUTO_SOURCE, why + agree, {}, left_out, sels), labels, searches)
    if sessions is None or sessions.held_out is None or sessions.patterns.n_sessions == 0:
        return Recommendation(None, "no sessions to compare the sources' models on" + agree, {}, left_out)
    models = {_model_of(s): s for s in implicit}
    if selection is None or selection[0] != tuple(models):
        selection = held_out_selection(implicit, sessions, ident, holdout=holdout)
        if selection is None:  # the checks above passed: one side of the split is empty
            return Recommendation(None, "too few searches to hold some out" + agree, {}, left_out)
    sel = selection[1]
    held = {models[s.model]: round(s.evaluation.conditional_perplexity_mean, 6)
            for s in sel.scores if s.evaluation is not None}
    for score in sel.scores:
        if score.error:
            left_out[models[score.model]] = f"could not be fitted: {score.error}"
    for model, reason in sel.excluded.items():  # e.g. COEC: its perplexity measures its predictor, not its grades
        left_out.setdefault(models[model], reason)
    if sel.best is None:
        why = ("no stored source is a candidate (see not recommended)" if held and set(held) <= set(left_out)
               else "no source's model could be scored on held-out searches")
        return Recommendation(None, why + agree, held, left_out)
    best = models[sel.best]
    runner = sorted((v, s) for s, v in held.items() if s != best and s not in left_out)
    why = (f"lowest held-out conditional perplexity ({held[best]:.4f}"
           + (f"; next {runner[0][1]} {runner[0][0]:.4f}" if runner else "")
           + f") on {sel.test_sessions:,} searches held out by query_id hash")
    return _supported(Recommendation(best, why + agree, held, left_out), labels, int(sel.test_sessions))
