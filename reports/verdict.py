"""The report's verdict: which system wins on which evidence and how firmly, what it could not decide, and what would.

Every format shows it first. It only states a direction the evidence supports; anything else is *undetermined*,
with the reason and what would decide it. A report that names a winner it cannot support is worse than one
that says undetermined (issue 24).

**A pair of systems** (a :class:`~ubi_pipeline.reports.pairs.PairView`): a line of evidence *counts* when its
interval excludes 0 (``Line.clear``: an interval exists, on at least ``MIN_BOOTSTRAP_N`` units). A predicted
line counts only when neither system's top k rests on the click model's prior (its interval holds the
sampling error, not the error of valuing documents the log never showed). Then:

* lines that count point both ways: undetermined (conflicting evidence);
* none counts: undetermined (no line excludes a tie);
* else the side they favour wins, *firmly* when two kinds of evidence or more agree, *on one line of
  evidence* otherwise (a line pointing the other way without excluding a tie is named).

**A predicted candidate** (a run that never served) against each logged system: the prediction's primary
interval of CTR@k (``Figure.cal_low``/``cal_high``, the calibrated interval; the bootstrap interval when there
is none) against the logged system's Wilson interval. Disjoint intervals order them (*predicted*: it rests
on the click model); overlapping ones are undetermined, with the share of the candidate's top k that rests on
assumptions (documents never shown for their query, never shown at all, and ``Prediction.evidence_shares``
per kind of evidence when the predictor gives them).

**What would decide** an undetermined (or single-line) pair: an A/B test when the two never shared traffic;
more traffic when they did (the searches at which the observed difference's interval would exclude 0, from the
interval's half-width h and the difference d: n·(h/d)², since h shrinks as 1/√n); interleaving when they were
never interleaved; human judgments for the (query, doc) pairs of their top k on the queries both rank that
have no human grade.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ubi_pipeline.reports.intervals import MIN_BOOTSTRAP_N
from ubi_pipeline.reports.online import OnlineMetrics
from ubi_pipeline.reports.pairs import Line, PairView

UNDETERMINED = "undetermined"
FIRM = "firm"
ONE_LINE = "on one line of evidence"
PREDICTED = "predicted only, resting on the click model"

#: The method whose figure a candidate is judged by, unless its prediction names one (``primary_method``).
PRIMARY_METHOD = "dr"


@dataclass(frozen=True)
class PairContext:
    """What the report knows about a pair beyond its lines: the queries both rank, how many (query, doc) pairs of
    their top k on those queries lack a human grade, and the larger share of their top k on the model's prior."""

    shared_queries: int = 0
    unjudged_pairs: int | None = None
    prior_share: float = 0.0
    k: int = 10


@dataclass(frozen=True)
class Finding:
    """One comparison's outcome: a winner with the evidence and how firmly, or undetermined and why."""

    reference: str
    challenger: str
    kind: str  # "pair" (two systems, every line of evidence) | "prediction" (a candidate against a logged system)
    winner: str | None
    firmness: str  # FIRM, ONE_LINE, PREDICTED, or UNDETERMINED
    evidence: tuple[str, ...]  # the lines the outcome rests on
    text: str
    would_decide: tuple[str, ...] = ()
    shares: dict[str, float] = field(default_factory=dict)  # prediction: share of the top k on each assumption

    @property
    def decided(self) -> bool:
        return self.winner is not None


@dataclass(frozen=True)
class Verdict:
    """The headline, every finding, and what the report could not decide (each with what would decide it)."""

    headline: str
    findings: tuple[Finding, ...]
    undecided: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"headline": self.headline, "findings": [asdict(f) for f in self.findings],
                "undecided": list(self.undecided)}


def _queries(n: int) -> str:
    return f"{n:,} quer{'y' if n == 1 else 'ies'}" if n != 1 else "one query"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _needed(n: int, diff: float, low: float, high: float) -> int | None:
    """Units at which an interval of this half-width, shrinking as 1/sqrt(n), would exclude 0 at this difference."""
    half = (high - low) / 2.0
    if not (math.isfinite(half) and math.isfinite(diff)) or abs(diff) < 1e-12 or n <= 0:
        return None
    need = n * (half / abs(diff)) ** 2
    digits = max(0, len(str(int(math.ceil(need)))) - 2)
    return int(math.ceil(need / 10**digits) * 10**digits)


def _line(pair: PairView, evidence: str) -> Line | None:
    return next((ln for ln in pair.lines if ln.evidence == evidence), None)


def would_decide(pair: PairView, ctx: PairContext) -> tuple[str, ...]:
    """What evidence would order the pair (module docstring)."""
    a, b = pair.reference, pair.challenger
    out: list[str] = []
    obs = _line(pair, "observed online (A/B)")
    inter = _line(pair, "interleaving")
    unserved = obs is not None and "never served" in (obs.missing or "")
    if obs is not None and not math.isfinite(obs.diff):
        if unserved:
            out.append(f"serving it: interleave {b} with {a}, or run an A/B test")
        else:
            out.append(f"an A/B test of {a} and {b} on one application's traffic at the same time")
    elif obs is not None and not obs.clear:
        need = _needed(obs.n or 0, obs.diff, obs.low, obs.high)
        out.append(f"more traffic: about {need:,} searches (now {obs.n:,}) if the observed difference holds"
                   if need is not None else "more A/B traffic (the observed difference is 0 so far)")
    if inter is not None and not math.isfinite(inter.diff) and not unserved:
        out.append(f"interleaving {a} and {b} (team draft)")
    elif inter is not None and math.isfinite(inter.diff) and not inter.clear:
        need = _needed(inter.n or 0, inter.diff, inter.low, inter.high) if (inter.n or 0) >= MIN_BOOTSTRAP_N else None
        out.append(f"more interleaved searches: about {need:,} with a winner (now {inter.n})" if need is not None
                   else f"more interleaved searches (now {inter.n} with a winner)")
    human = _line(pair, "human offline")
    if human is not None and not human.clear:
        if ctx.shared_queries == 0:
            out.append(f"human judgments on queries both {a} and {b} rank (they share none)")
        elif ctx.unjudged_pairs:
            out.append(f"human judgments for {ctx.unjudged_pairs:,} (query, doc) pair{'s' if ctx.unjudged_pairs != 1 else ''} "
                       f"of their top {ctx.k} on the {_queries(ctx.shared_queries)} both rank")
        elif (human.n or 0) < MIN_BOOTSTRAP_N:
            out.append(f"human judgments on at least {MIN_BOOTSTRAP_N} queries both rank (now {human.n or 0})")
    return tuple(out)


def pair_finding(pair: PairView, ctx: PairContext) -> Finding:
    """The outcome of one pair (module docstring)."""
    a, b = pair.reference, pair.challenger
    counted: list[Line] = []
    caveats: list[str] = []
    for ln in pair.lines:
        if not math.isfinite(ln.diff):
            continue
        if ln.evidence == "predicted online" and ctx.prior_share > 0 and ln.clear:
            who = b if ln.sign > 0 else a
            caveats.append(f"the predicted line favours {who} but {_pct(ctx.prior_share)} of a top {ctx.k} rests "
                           "on the click model's prior")
            continue
        if ln.clear:
            counted.append(ln)
    pro = [ln for ln in counted if ln.sign > 0]
    con = [ln for ln in counted if ln.sign < 0]
    decide = would_decide(pair, ctx)
    caveat = f"; {'; '.join(caveats)}" if caveats else ""
    if pro and con:
        text = (f"{b} vs {a}: {UNDETERMINED}: conflicting evidence ({', '.join(ln.evidence for ln in pro)} "
                f"favour {b}; {', '.join(ln.evidence for ln in con)} favour {a}){caveat}")
        return Finding(a, b, "pair", None, UNDETERMINED, (), text, decide)
    if not counted:
        pointing = [ln for ln in pair.lines if math.isfinite(ln.diff)]
        why = ("no line of evidence has a figure" if not pointing else
               "no line of evidence excludes a tie (" + "; ".join(
                   f"{ln.evidence}: {'no interval' if ln.clear is None else 'interval holds 0'}" for ln in pointing) + ")")
        return Finding(a, b, "pair", None, UNDETERMINED, (), f"{b} vs {a}: {UNDETERMINED}: {why}{caveat}", decide)
    lines, winner, loser = (pro, b, a) if pro else (con, a, b)
    kinds = tuple(dict.fromkeys(ln.evidence for ln in lines))
    firm = FIRM if len(kinds) >= 2 else ONE_LINE
    against = [ln.evidence for ln in pair.lines
               if math.isfinite(ln.diff) and ln.sign == (-1 if winner == b else 1) and ln not in counted]
    text = f"{winner} ahead of {loser} on {', '.join(kinds)} ({firm})"
    if against:
        text += f"; {', '.join(against)} point{'s' if len(against) == 1 else ''} the other way without excluding a tie"
    return Finding(a, b, "pair", winner, firm, kinds, text + caveat, decide if firm != FIRM else ())


def _primary(pred: Any) -> tuple[str, Any] | None:
    """(method, CTR@k figure) a candidate is judged by: ``primary_method`` when the prediction names one, else dr."""
    method = getattr(pred, "primary_method", None) or PRIMARY_METHOD
    figs = pred.figures.get(method) or next((f for f in pred.figures.values() if "ctr@k" in f), None)
    if figs is None or figs.get("ctr@k") is None:
        return None
    return (method if method in pred.figures else next(m for m, f in pred.figures.items() if f is figs)), figs["ctr@k"]


def assumption_shares(pred: Any) -> dict[str, float]:
    """The shares of a candidate's top k resting on assumptions: never shown for its query, never shown in the
    log, and each kind of evidence of ``evidence_shares`` when the predictor gives it."""
    out = {"never shown for its query": float(pred.prior_share),
           "never shown in the log (no IPS support)": float(pred.unsupported_share)}
    extra = getattr(pred, "evidence_shares", None)
    if isinstance(extra, Mapping):
        out.update({str(k): float(v) for k, v in extra.items()})
    return out


#: how the kinds of ``Prediction.evidence_shares`` read in a sentence
EVIDENCE_WORDS = {"shown": "shown in the log", "human_grade": "human grades", "returned_not_shown":
                  "returned by the logging rankers below the displayed depth", "candidate_score": "the run's scores",
                  "prior": "the click model's prior only"}


def rests_on(pred: Any) -> str:
    """What the candidate's top k rests on, in words: each kind of evidence with its share (those above 0), or,
    from a predictor that gives no evidence shares, the shares never shown for their query and never shown at all."""
    extra = getattr(pred, "evidence_shares", None)
    if isinstance(extra, Mapping) and extra:
        parts = [f"{EVIDENCE_WORDS.get(str(k), str(k))} {_pct(float(v))}" for k, v in extra.items() if float(v) > 0]
        return "its top k rests on " + ", ".join(parts)
    return "on assumptions: " + ", ".join(f"{kind} {_pct(v)}" for kind, v in assumption_shares(pred).items())


def candidate_findings(name: str, pred: Any, logged: Mapping[str, OnlineMetrics], k: int,
                       veto: str | None = None) -> list[Finding]:
    """A predicted candidate against every logged system with a CTR@k (module docstring); ``veto``: why the click
    model cannot be trusted on this log (the identifiability verdict), which leaves every comparison undetermined."""
    primary = None if veto is not None else _primary(pred)
    shares = assumption_shares(pred)
    share_text = rests_on(pred)
    out = []
    for system, om in logged.items():
        iv = om.metrics.get(f"ctr@{k}")
        if iv is None or not math.isfinite(iv.value):
            continue
        decide = (f"interleaving {name} with {system} (team draft)", f"an A/B test of {name} against {system}")
        if primary is None:
            out.append(Finding(system, name, "prediction", None, UNDETERMINED, (),
                               f"{name} vs {system}: {UNDETERMINED}: {veto or f'no predicted CTR@{k}'}", decide, shares))
            continue
        method, fig = primary
        lo, hi, which = fig.cal_low, fig.cal_high, "primary"
        if not (math.isfinite(lo) and math.isfinite(hi)):
            lo, hi, which = fig.low, fig.high, "bootstrap"
        head = f"{name} vs {system} (CTR@{k}, {method}, {which} interval)"
        if not (math.isfinite(lo) and math.isfinite(hi)):
            out.append(Finding(system, name, "prediction", None, UNDETERMINED, (),
                               f"{head}: {UNDETERMINED}: the prediction has no interval", decide, shares))
            continue
        spans = f"predicted [{lo:.3f}, {hi:.3f}], observed {iv.value:.3f} [{iv.low:.3f}, {iv.high:.3f}]"
        if lo > iv.high or hi < iv.low:
            winner, loser = (name, system) if lo > iv.high else (system, name)
            out.append(Finding(system, name, "prediction", winner, PREDICTED, ("predicted online",),
                               f"{head}: {winner} ahead of {loser} ({PREDICTED}): {spans}; "
                               f"{share_text}", (), shares))
        else:
            out.append(Finding(system, name, "prediction", None, UNDETERMINED, (),
                               f"{head}: {UNDETERMINED}: the intervals overlap ({spans}); {share_text}",
                               decide, shares))
    return out


def _short(f: Finding) -> str:
    """A decided finding in a few words: who is ahead of whom and how firmly (a pair's first clause)."""
    if f.kind == "prediction":
        loser = f.reference if f.winner == f.challenger else f.challenger
        return f"{f.winner} ahead of {loser} ({f.firmness})"
    return f.text.split("; ", 1)[0]


def decide(pairs: Sequence[PairView], contexts: Mapping[tuple[str, str], PairContext],
           candidates: Sequence[Finding] = (), recommendation: Mapping[str, Any] | None = None,
           notes: Sequence[str] = ()) -> Verdict:
    """The verdict over every pair and predicted candidate; ``notes``: other things the report could not decide."""
    findings = [pair_finding(p, contexts.get((p.reference, p.challenger), PairContext())) for p in pairs]
    findings += list(candidates)
    decided = [f for f in findings if f.decided]
    undecided = [f"{f.challenger} vs {f.reference}{' (its prediction)' if f.kind == 'prediction' else ''}: "
                 + ("; ".join(f.would_decide) if f.would_decide else "nothing in reach of this report")
                 for f in findings if not f.decided]
    undecided += [f"{f.challenger} vs {f.reference}, more firmly: {'; '.join(f.would_decide)}"
                  for f in decided if f.would_decide]
    if recommendation is not None and recommendation.get("source") is None and recommendation.get("leader"):
        undecided.append(f"which implicit source to trust: {recommendation['why']}")
    undecided += list(notes)
    if not findings:
        headline = "no two systems to compare: nothing to decide"
    elif not decided:
        headline = (f"{UNDETERMINED}: the evidence cannot order {findings[0].challenger} and {findings[0].reference}"
                    if len(findings) == 1 else
                    f"{UNDETERMINED}: the evidence orders none of the {len(findings)} comparisons")
    else:
        rest = len(findings) - len(decided)
        # the headline names each decided order once, shortly; the findings below carry the caveats and figures
        headline = "; ".join(_short(f) for f in decided)
        if rest:
            headline += f"; {rest} other comparison{'s' if rest != 1 else ''} {UNDETERMINED}"
    return Verdict(headline, tuple(findings), tuple(undecided))
