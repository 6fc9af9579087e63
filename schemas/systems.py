"""How a system is named: the application of a query record, split by keys of its ``query_attributes``.

A *system* is the ``application`` of a query record, split further by the ``ranker`` and ``experiment`` keys of
its ``query_attributes`` when present: ``shop``, ``shop/ranker=bm25``, ``shop/ranker=ltr/experiment=b``. Query
records without an application belong to ``(no application)``. The rule is written twice, in Python
(:func:`system_name`, for records in memory and the simulator) and in SQL (:func:`system_sql`, for the store),
side by side here so that they stay one rule (``tests/reports/test_systems.py`` checks that they agree).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import orjson

from ubi_pipeline.schemas.cli_names import DEFAULT_SPLIT_KEYS
from ubi_pipeline.schemas.errors import UbiError

NO_APPLICATION = "(no application)"

_KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")


class SystemsError(UbiError):
    """Bad arguments for finding systems (an unusable attribute key, an unknown mode)."""


def json_path(key: str, what: str) -> str:
    """The JSON path of a ``query_attributes`` key, for DuckDB's json functions; a key outside [A-Za-z0-9_.-] is an
    error naming ``what`` it was given as."""
    if not _KEY.match(key):
        raise SystemsError(f"{what} {key!r}: use letters, digits, '_', '.', '-' only (a query_attributes key)")
    return f'$."{key}"'


def system_name(application: str | None, attributes: Mapping[str, object] | None,
                split_keys: Sequence[str] = DEFAULT_SPLIT_KEYS) -> str:
    """The system of one query record, by the rule above, in Python:
    the application (``(no application)`` without one), then ``/key=value`` for each split key present.

    The click models' rank-informed prior takes the systems of a simulated log from here and those of a store
    from :func:`system_sql`, so both name a system alike (``tests/reports/test_systems.py`` checks the two).
    """
    out = application if application is not None else NO_APPLICATION
    for key in split_keys:
        json_path(key, "split key")
        value = (attributes or {}).get(key)
        if value is not None:
            out += f"/{key}={value if isinstance(value, str) else _json_text(value)}"
    return out


def _json_text(value: object) -> str:
    """How DuckDB's json_extract_string writes a non-string JSON value (numbers, booleans, objects)."""
    return orjson.dumps(value).decode()


def system_sql(split_keys: Sequence[str] = DEFAULT_SPLIT_KEYS) -> tuple[str, list[str]]:
    """The SQL expression of a query record's system over ``application`` and ``query_attributes`` (one
    place for ``ubi_pipeline.reports.systems.load_searches`` and ``ubi_pipeline.processors.clicks.system_rankings``), and its parameters."""
    parts = ["coalesce(application, '" + NO_APPLICATION + "')"]
    params: list[str] = []
    for key in split_keys:
        parts.append(f"coalesce('/{key}=' || json_extract_string(query_attributes, ?), '')")
        params.append(json_path(key, "split key"))
    return " || ".join(parts), params
