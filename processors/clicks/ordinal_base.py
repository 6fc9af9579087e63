"""Which base each application's ``position.ordinal`` counts from: the evidence, the choice, a suggestion.

Producers disagree: OpenSearch tooling counts results from 0, other tooling from 1, and one producer can
change its mind (Chorus in the ESCI sample counted from 1 until February 2025, then from 0 except for the
first result). Where an event's object is in its search's hit list, the list says the true rank r, so the
ordinal is evidence: ``ordinal == r - 1`` fits base 0, ``ordinal == r`` fits base 1.

:func:`choose_bases` decides per application, in this order (explicit settings always win):

1. an entry of ``Settings.position_base_by_application`` (``UBI_POSITION_BASE_BY_APPLICATION``);
2. ``Settings.position_base`` when it was given explicitly (``UBI_POSITION_BASE``, ``--position-base 0|1``)
   or detection is off (``position_base_auto=False``);
3. detection: the base more of its checked ordinals fit, when at least :data:`MIN_EVIDENCE` were checked
   and one base fits more than the other;
4. else ``Settings.position_base`` (default 0).

:func:`suggestion` names the ``UBI_POSITION_BASE_BY_APPLICATION`` value that would fit the data best when
the base in use disagrees with the majority of an application's checked ordinals.
Nothing here touches a database: the counts come from :func:`ubi_pipeline.processors.clicks.sessions.position_base_evidence`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ubi_pipeline.schemas.settings import Settings

#: Fewest ordinals checked against hit lists before an application's base is detected from them.
MIN_EVIDENCE = 20


@dataclass(frozen=True)
class BaseEvidence:
    """Ordinals of one application checked against hit lists: how many fit base 0, base 1, of all checked."""

    application: str
    base0: int
    base1: int
    checked: int

    @property
    def best(self) -> int | None:
        """The base more ordinals fit, or None on a tie or too little evidence."""
        if self.checked < MIN_EVIDENCE or self.base0 == self.base1:
            return None
        return 1 if self.base1 > self.base0 else 0


@dataclass(frozen=True)
class BaseChoice:
    """The base in use for one application and why (``how``: setting, flag or default, detected)."""

    application: str
    base: int
    how: str
    evidence: BaseEvidence | None

    @property
    def disagrees(self) -> bool:
        """The data fits another base better than the one in use."""
        best = self.evidence.best if self.evidence is not None else None
        return best is not None and best != self.base

    def as_dict(self) -> dict[str, Any]:
        return {"application": self.application, "base": self.base, "how": self.how,
                "evidence": asdict(self.evidence) if self.evidence is not None else None,
                "disagrees": self.disagrees}


def choose_bases(evidence: Mapping[str, BaseEvidence], settings: Settings) -> dict[str, BaseChoice]:
    """The base of every application that has evidence or a per-application setting (rules: module docstring)."""
    given = settings.model_fields_set
    # UBI_POSITION_BASE alone turns detection off; `--position-base auto` (position_base_auto given) turns it on
    explicit = not settings.position_base_auto or ("position_base" in given and "position_base_auto" not in given)
    how_default = "UBI_POSITION_BASE / --position-base" if "position_base" in settings.model_fields_set else "default"
    out: dict[str, BaseChoice] = {}
    for app in sorted(set(evidence) | set(settings.position_base_by_application)):
        ev = evidence.get(app)
        if app in settings.position_base_by_application:
            out[app] = BaseChoice(app, int(settings.position_base_by_application[app]),
                                  "UBI_POSITION_BASE_BY_APPLICATION", ev)
        elif explicit:
            out[app] = BaseChoice(app, int(settings.position_base), how_default, ev)
        elif ev is not None and ev.best is not None:
            out[app] = BaseChoice(app, ev.best, "detected", ev)
        else:
            why = "too little evidence to detect" if ev is None or ev.checked < MIN_EVIDENCE else "evidence tied"
            out[app] = BaseChoice(app, int(settings.position_base), f"default ({why})", ev)
    return out


def effective_bases(choices: Mapping[str, BaseChoice]) -> dict[str, int]:
    """The per-application map the session builder and the online metrics use."""
    return {app: c.base for app, c in choices.items()}


def suggestion(choices: Mapping[str, BaseChoice], settings: Settings) -> str | None:
    """``UBI_POSITION_BASE_BY_APPLICATION='{...}'`` fitting the data, when some base in use disagrees with it."""
    if not any(c.disagrees for c in choices.values()):
        return None
    best = dict(settings.position_base_by_application)
    for app, c in choices.items():
        if c.disagrees and c.evidence is not None and c.evidence.best is not None:
            best[app] = c.evidence.best
    return "UBI_POSITION_BASE_BY_APPLICATION='" + json.dumps(dict(sorted(best.items()))) + "'"


def describe(choice: BaseChoice) -> str:
    """One line: the evidence, and the base in use with its reason."""
    name = choice.application or "(no application)"
    ev = choice.evidence
    facts = (f"{ev.base0:,} fit base 0, {ev.base1:,} fit base 1 (of {ev.checked:,} checked against hit lists)"
             if ev is not None else "no ordinal to check against a hit list")
    line = f"ordinals of {name}: {facts}; base in use: {choice.base} ({choice.how})"
    if choice.disagrees:
        line += f"; the data fits base {ev.best if ev is not None else '?'} better"
    return line


def position_base_flags(value: str | None) -> dict[str, Any]:
    """Settings keywords of ``--position-base auto|0|1`` (None: the flag was not given)."""
    if value is None:
        return {}
    if value == "auto":
        return {"position_base_auto": True}
    return {"position_base": int(value), "position_base_auto": False}
