"""A document catalogue (``--docs catalog.jsonl``): the display fields people (``ubi review serve``) and model judges
(``ubi judge``) see of each document. One reader for both, so that a file one command accepts the other does too."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import orjson

from ubi_pipeline.schemas.errors import InputFileError

#: the fields a catalogue line may give besides ``doc_id`` (strings; ``image`` and ``url`` http(s) URLs)
DOC_FIELDS = ("title", "description", "image", "url")


def _http_url(value: str, path: Path, line: int, name: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputFileError(str(path), line, f"'{name}' must be an http(s) URL, got {value[:80]!r}")
    return value


def read_docs(path: Path) -> dict[str, dict[str, str]]:
    """The display fields of a JSONL catalog: ``doc_id`` plus any of title, description, image, url (strings;
    image and url http(s) URLs). The first bad line raises naming it; a doc id given twice too."""
    docs: dict[str, dict[str, str]] = {}
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below; the error names the file)
    except OSError as exc:
        raise InputFileError(str(path), None, f"cannot read the catalog: {exc}") from exc
    with f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise InputFileError(str(path), number, f"malformed JSON: {exc.msg} (column {exc.colno})") from exc
            if not isinstance(obj, dict):
                raise InputFileError(str(path), number, "expected a JSON object with doc_id")
            doc_id = obj.get("doc_id")
            if not isinstance(doc_id, str) or not doc_id.strip():
                raise InputFileError(str(path), number, "'doc_id' must be a non-empty string")
            if doc_id in docs:
                raise InputFileError(str(path), number, f"doc_id {doc_id!r} given twice")
            fields: dict[str, str] = {}
            for name in DOC_FIELDS:
                value = obj.get(name)
                if value is None:
                    continue
                if not isinstance(value, str):
                    raise InputFileError(str(path), number, f"'{name}' must be a string, got {type(value).__name__}")
                fields[name] = _http_url(value, path, number, name) if name in ("image", "url") else value
            docs[doc_id] = fields
    return docs
