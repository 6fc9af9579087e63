"""The record filters of the collector's security settings, apart from its HTTP middleware (no Starlette
here, so ``ubi import`` applies them without loading the web stack): :class:`ApplicationCheck` refuses a
request in which a record's ``application`` is not its API key's, and :class:`Privacy` replaces identifying
fields with a keyed hash and drops the fields an operator does not want stored, in stored records and in what
``failed_records`` keeps (:func:`body_filters`). ``ubi_pipeline.collector.security`` installs them with the
middleware and re-exports them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from pydantic import ValidationError

from ubi_pipeline.collector.bodies import bulk_verb
from ubi_pipeline.collector.errors import RequestError
from ubi_pipeline.collector.ingest import IngestContext, ItemError, RecordFilter, Validated
from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.schemas.settings import Settings
from ubi_pipeline.schemas.ubi import UbiEvent, UbiQuery

Record = UbiQuery | UbiEvent


class Forbidden(RequestError):
    """Records claim an application their API key does not belong to (403); the body is kept."""

    status_code = 403
    kind = "forbidden"


def _digest(key: str) -> bytes:
    # Comparing fixed-length digests keeps compare_digest's time independent of the key's length too.
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    """Which application an ``X-API-Key`` belongs to, checked in constant time against every key."""

    def __init__(self, keys: Mapping[str, Sequence[str]]) -> None:
        self._keys = [(_digest(k), app) for app, ks in keys.items() for k in ks if k]

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        return cls({app: [k.get_secret_value() for k in keys] for app, keys in settings.api_keys.items()})

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def application_for(self, presented: str | None) -> str | None:
        """The application of a presented key, or ``None`` when it matches no configured key."""
        if not presented:
            return None
        digest = _digest(presented)
        found = None
        for known, app in self._keys:  # no early exit: the time taken does not say which key matched
            if hmac.compare_digest(known, digest):
                found = app
        return found


# ---------------------------------------------------------------- record filters


class ApplicationCheck:
    """Records must belong to their API key's application (else 403); a record without one gets it.

    One key authorises one request, so a request in which any record claims another application is refused
    as a whole and its body kept in ``failed_records`` (kind ``forbidden``), the reason naming each item.
    """

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys

    def __call__(self, batch: Validated, ctx: IngestContext) -> Validated:
        application = ctx.application  # resolved once, by the gate (presented_key)
        if application is None:  # `ubi import` and other local loaders carry no key: nothing to check
            return batch
        wrong: list[str] = []

        def own(index: int, record: Record) -> Record:
            if record.application is None:
                return record.model_copy(update={"application": application})
            if record.application != application:
                wrong.append(f"item {index}, field 'application': {record.application!r}")
            return record

        batch.queries = [(i, own(i, q)) for i, q in batch.queries]  # type: ignore[misc]
        batch.events = [(i, own(i, e), b) for i, e, b in batch.events]  # type: ignore[misc]
        if wrong:
            more = f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else ""
            raise Forbidden(
                f"the API key belongs to application {application!r}; records claim another: "
                + "; ".join(wrong[:3])
                + more
            )
        return batch


def pseudonym(value: str, key: bytes) -> str:
    """HMAC-SHA256 of ``value`` under ``key``, hex, first 32 characters (128 bits, stable for one key)."""
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:32]


class DropFailed(UbiError):
    """Dropping the configured fields left a record invalid; it is rejected and kept, scrubbed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field '{field}': {message}")
        self.field, self.message = field, message


class Privacy:
    """Replace identifying fields with their keyed hash and drop unwanted fields, before storage.

    The same input and key always give the same pseudonym, so sessions and clients still link up, but the
    original value cannot be recovered without the key (keep it away from the database; rotating it changes
    every pseudonym). Empty strings stay empty (``user_id`` may be ``""`` for anonymous users).

    What is kept in ``failed_records`` is scrubbed too (:meth:`scrub`): rejected items, conflicting records,
    and whole bodies refused as a whole (403, 413 for too many items, 415, 400, 422). Stored reasons do not
    quote the values of these fields (:meth:`scrub_error`).
    """

    def __init__(self, key: bytes | None, fields: Sequence[str], drop: Sequence[str]) -> None:
        self.key = key
        self.fields = tuple(fields) if key else ()
        self.drop_top = tuple(f for f in drop if "." not in f)
        self.drop_nested = tuple(tuple(f.split(".")) for f in drop if "." in f)

    @classmethod
    def from_settings(cls, settings: Settings) -> Privacy:
        key = settings.pseudonymise_key.get_secret_value().encode() if settings.pseudonymise_key else None
        return cls(key, settings.pseudonymise_fields, settings.drop_fields)

    @property
    def enabled(self) -> bool:
        return bool(self.fields or self.drop_top or self.drop_nested)

    def record(self, record: Record) -> Record:
        """One record with its identifying fields hashed and the dropped fields gone."""
        update: dict[str, Any] = {}
        known = type(record).model_fields
        extra = record.__pydantic_extra__ or {}
        for name in self.fields:
            value = getattr(record, name) if name in known else extra.get(name)
            if isinstance(value, str) and value and self.key is not None:
                update[name] = pseudonym(value, self.key)
        for name in self.drop_top:
            if name in known:
                update[name] = None
        out = record.model_copy(update=update) if update else record
        dropped_extra = [n for n in self.drop_top if n in extra]
        if dropped_extra or self.drop_nested:
            out = _rebuild_without(out, dropped_extra, self.drop_nested)
        return out

    def __call__(self, batch: Validated, ctx: IngestContext) -> Validated:
        if not self.enabled:
            return batch
        # Items rejected so far carry their raw bytes and messages: scrub them once, here. Raw bytes of the
        # valid items are scrubbed only if one is kept later (a conflict, or a record that cannot be stored).
        batch.errors = [self.scrub_error(e) for e in batch.errors]
        batch.raws = ScrubbedRaws(batch.raws, self.scrub)
        failed: list[tuple[int, DropFailed]] = []

        def apply(index: int, record: Record) -> Record | None:
            try:
                return self.record(record)
            except DropFailed as exc:
                failed.append((index, exc))
                return None

        queries = [(i, apply(i, q)) for i, q in batch.queries]
        events = [(i, apply(i, e), b) for i, e, b in batch.events]
        batch.queries = [(i, q) for i, q in queries if q is not None]  # type: ignore[misc]
        batch.events = [(i, e, b) for i, e, b in events if e is not None]  # type: ignore[misc]
        for index, exc in failed:  # their raw bytes come from the scrubbed raws
            batch.reject(index, field=exc.field, message=exc.message, kind="privacy")
        return batch

    # ------------------------------------------------------------ what failed_records keeps

    def scrub_error(self, error: ItemError) -> ItemError:
        """A rejected item with its raw bytes scrubbed and its message not quoting a scrubbed field's value."""
        return dataclasses.replace(
            error, raw=self.scrub(error.raw), message=self._quiet(error.message, error.raw)
        )

    def _quiet(self, message: str, raw: bytes) -> str:
        # ubi_pipeline.collector.ingest quotes an invalid field's input as "(got <repr(value)[:80]>)"; for a field that is
        # pseudonymised or dropped that would store the very value the settings keep out of the database.
        if "(got " not in message:
            return message
        data = _loads(raw)
        if not isinstance(data, dict):
            return message
        paths = [(n,) for n in (*self.fields, *self.drop_top)] + list(self.drop_nested)
        for path in paths:
            value = _get_path(data, path)
            if value is None or value == "" or isinstance(value, dict | list):
                continue
            shown = [repr(value)[:80]]
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
                shown.append(repr(float(value))[:80])  # what orjson, the collector's parser, made of it
            for text in shown:
                message = message.replace(
                    f"(got {text})", f"(value of '{'.'.join(path)}' not shown: privacy settings)"
                )
        return message

    def scrub(self, raw: bytes) -> bytes:
        """Bytes about to be kept in ``failed_records`` (one item or a whole body), scrubbed like records.

        * JSON: every object, at the top level or as an array item, gets the configured fields hashed and
          dropped, as stored records do; a string or number outside any object field (an item that is not
          a record) is replaced by a redaction marker, since it may be the very id or text to hide.
        * NDJSON and ``_bulk`` bodies: the same, line by line; ``_bulk`` action lines are kept as they are.
        * Anything that is not JSON (a whole body, or one line of it): a redaction marker
          ``{"ubi_redacted": why, "bytes": n, "hmac_sha256" (keyed by the pseudonymisation key) or
          "sha256": digest}``. Personal data in it cannot be located, so it is not kept; the digest still
          lets a sender match the body it sent.

        Identity when no privacy setting is on: then the collector keeps every body as received.
        """
        if not self.enabled or not raw.strip():
            return raw
        try:
            value = _loads(raw, strict=True)
        except _NOT_JSON:
            if b"\n" not in raw.strip():
                return self._marker(raw, "not JSON")
            return b"\n".join(self._scrub_line(line) for line in raw.split(b"\n"))
        return self._dumps(self._scrub_value(value), raw)

    def _scrub_line(self, line: bytes) -> bytes:
        if not line.strip():
            return line
        try:
            value = _loads(line, strict=True)
        except _NOT_JSON:
            return self._marker(line, "a line that is not JSON")
        if bulk_verb(value) is not None:
            return line
        return self._dumps(self._scrub_value(value), line)

    def _scrub_value(self, value: Any) -> Any:
        if isinstance(value, dict):
            return self._scrub_object(value)
        if isinstance(value, list):
            return [self._scrub_value(v) for v in value]
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return self._marker_object(_json_text(value).encode(), "a value that is not a record")
        return value  # null, true, false

    def _scrub_object(self, data: dict[str, Any]) -> dict[str, Any]:
        if self.key is not None:
            for name in self.fields:
                value = data.get(name)
                if value is None or value == "":
                    continue
                data[name] = pseudonym(value if isinstance(value, str) else _json_text(value), self.key)
        for name in self.drop_top:
            data.pop(name, None)
        for path in self.drop_nested:
            _pop_path(data, path)
        return data

    def _marker_object(self, data: bytes, why: str) -> dict[str, Any]:
        if self.key is not None:
            digest = ("hmac_sha256", hmac.new(self.key, data, hashlib.sha256).hexdigest())
        else:
            digest = ("sha256", hashlib.sha256(data).hexdigest())
        return {
            "ubi_redacted": f"{why}: not kept because privacy settings are on",
            "bytes": len(data),
            digest[0]: digest[1],
        }

    def _marker(self, data: bytes, why: str) -> bytes:
        return orjson.dumps(self._marker_object(data, why))

    def _dumps(self, value: Any, original: bytes) -> bytes:
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            try:
                return text.encode()
            except UnicodeEncodeError:  # a lone surrogate escape: keep the escapes
                return json.dumps(value, separators=(",", ":")).encode()
        except (ValueError, TypeError, RecursionError):
            return self._marker(original, "JSON that cannot be written back")


#: What the standard library's JSON parser raises for bytes that are not JSON (or nest past the stack).
_NOT_JSON = (ValueError, RecursionError)


def _loads(raw: bytes, *, strict: bool = False) -> Any:
    """JSON by the standard library: unlike orjson it keeps integers beyond 64 bits exactly."""
    try:
        return json.loads(raw)
    except _NOT_JSON:
        if strict:
            raise
        return None


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError):
        return repr(value)


def _get_path(data: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data


class ScrubbedRaws(dict[int, bytes]):
    """Raw item bytes scrubbed on first read: most are never read (only rejected items are kept)."""

    def __init__(self, raws: Mapping[int, bytes], scrub: Callable[[bytes], bytes]) -> None:
        super().__init__(raws)
        self._scrub = scrub
        self._done: set[int] = set()

    def __getitem__(self, index: int) -> bytes:
        raw = super().__getitem__(index)
        if index not in self._done:
            raw = self._scrub(raw)
            super().__setitem__(index, raw)
            self._done.add(index)
        return raw

    def get(self, index: int, default: Any = None) -> Any:  # type: ignore[override]
        return self[index] if index in self else default

    def values(self) -> Any:
        return [self[i] for i in self]

    def items(self) -> Any:
        return [(i, self[i]) for i in self]


def _rebuild_without(record: Record, top: Sequence[str], nested: Sequence[tuple[str, ...]]) -> Record:
    """Re-validate ``record`` without some extra keys and dotted paths (only when configured)."""
    data = record.model_dump(mode="json", exclude_none=True)
    for name in top:
        data.pop(name, None)
    for path in nested:
        _pop_path(data, path)
    try:
        return type(record).model_validate(data)
    except ValidationError as exc:
        where = ", ".join(".".join(p) for p in nested)
        raise DropFailed(
            where,
            "dropping the configured fields (UBI_DROP_FIELDS) leaves an invalid record: "
            f"{exc.errors(include_url=False)[0]['msg']}",
        ) from exc


def _pop_path(data: dict[str, Any], path: tuple[str, ...]) -> None:
    node: Any = data
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(path[-1], None)


def body_filters(settings: Settings) -> list[Callable[[bytes], bytes]]:
    """What scrubs a body refused as a whole before ``failed_records`` keeps it (privacy, when it is on)."""
    privacy = Privacy.from_settings(settings)
    return [privacy.scrub] if privacy.enabled else []


def record_filters(settings: Settings) -> list[RecordFilter]:
    """The record filters the settings ask for, in order: the key check first, then privacy."""
    filters: list[RecordFilter] = []
    keys = ApiKeys.from_settings(settings)
    if keys.enabled:
        filters.append(ApplicationCheck(keys))
    privacy = Privacy.from_settings(settings)
    if privacy.enabled:
        filters.append(privacy)
    return filters
