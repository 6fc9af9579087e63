"""Metric names: parse ``ndcg@10``, ``recall@100``, ``mrr``, ``map``, ``p@5``, ``judged@10`` into specs."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal, NamedTuple

from ubi_pipeline.schemas.cli_names import GAINS, KNOWN_METRICS
from ubi_pipeline.schemas.errors import UbiError

Gain = Literal["linear", "exponential"]


class MetricError(UbiError):
    """A metric request or an in-memory input to the metrics is invalid; the message says how to fix it."""


class MetricSpec(NamedTuple):
    """One requested metric: ``name`` as the caller spelled it (lower-cased), the measure, cutoff and gain."""

    name: str
    measure: str  # p | recall | rr | ap | ndcg | judged
    k: int | None  # None: the whole ranking
    gain: str | None = None  # ndcg only: linear | exponential

    def describe(self) -> str:
        """Long label, e.g. ``nDCG@10 (exponential gain 2^g-1)``."""
        base = _LABELS[self.measure] + (f"@{self.k}" if self.k is not None else "")
        if self.measure == "ndcg":
            base += " (exponential gain 2^g-1)" if self.gain == "exponential" else " (linear gain)"
        return base


# Spellings users bring (ours, trec_eval's and ranx's) -> (measure, forced gain).
_ALIASES: dict[str, tuple[str, str | None]] = {
    "p": ("p", None), "precision": ("p", None),
    "recall": ("recall", None), "r": ("recall", None),
    "rr": ("rr", None), "mrr": ("rr", None), "recip_rank": ("rr", None),
    "ap": ("ap", None), "map": ("ap", None),
    "ndcg": ("ndcg", None), "ndcg_exp": ("ndcg", "exponential"), "ndcg_burges": ("ndcg", "exponential"),
    "judged": ("judged", None),
}
_NEEDS_K = frozenset({"p"})
_LABELS = {"p": "Precision", "recall": "Recall", "rr": "Reciprocal rank", "ap": "Average precision",
           "ndcg": "nDCG", "judged": "Judged"}
_NAME = re.compile(r"([a-z_]+)(?:@(.*))?")
KNOWN = KNOWN_METRICS


def parse_metric(name: str, *, gain: str = "linear") -> MetricSpec:
    """Parse one metric name; ``gain`` applies to ``ndcg`` (``ndcg_exp`` is always exponential)."""
    if gain not in GAINS:
        raise MetricError(f"unknown gain {gain!r}: use 'linear' (trec_eval ndcg_cut) or 'exponential' (2^g-1)")
    text = name.strip().lower()
    match = _NAME.fullmatch(text)
    if not match or match.group(1) not in _ALIASES:
        raise MetricError(f"unknown metric {name!r}; known: {KNOWN}")
    measure, forced_gain = _ALIASES[match.group(1)]
    k: int | None = None
    if match.group(2) is not None:
        cutoff = match.group(2)
        if not re.fullmatch(r"[+-]?[0-9]+", cutoff):
            raise MetricError(f"metric {name!r}: cutoff {cutoff!r} must be a whole number k >= 1")
        k = int(cutoff)
        if k < 1:
            raise MetricError(f"metric {name!r}: cutoff k must be >= 1, got {k}")
    elif measure in _NEEDS_K:
        raise MetricError(f"metric {name!r} needs a cutoff, e.g. {match.group(1)}@10")
    spec_gain = (forced_gain or gain) if measure == "ndcg" else None
    return MetricSpec(text, measure, k, spec_gain)


def parse_metrics(names: str | Sequence[str], *, gain: str = "linear") -> list[MetricSpec]:
    """Parse a comma-separated string or a list of names; repeated names are kept once, in order."""
    items = names.split(",") if isinstance(names, str) else list(names)
    specs: list[MetricSpec] = []
    seen: set[str] = set()
    for item in items:
        if isinstance(item, str) and not item.strip():
            raise MetricError(f"empty metric name in {names!r}; separate names with single commas")
        spec = parse_metric(item, gain=gain)
        if spec.name not in seen:
            seen.add(spec.name)
            specs.append(spec)
    if not specs:
        raise MetricError(f"no metrics requested; known: {KNOWN}")
    return specs
