"""The root of every error ubi-pipeline raises on purpose.

Each package subclasses these; callers catch :class:`UbiError` to handle any of them. Errors about input
name where the problem is (file and line, or batch index and field) and what was expected.
"""

from __future__ import annotations


class UbiError(Exception):
    """Root of all ubi-pipeline errors."""


class SchemaError(UbiError):
    """A record does not match the UBI schema (or one of our own record shapes)."""

    def __init__(self, message: str, *, field: str | None = None, index: int | None = None) -> None:
        self.field = field
        self.index = index
        where = []
        if index is not None:
            where.append(f"item {index}")
        if field:
            where.append(f"field '{field}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.message = message


class InputFileError(UbiError):
    """A file given to a command is malformed; the message names the file and the line."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        loc = f"{path}:{line}" if line is not None else path
        super().__init__(f"{loc}: {message}")


class SettingsError(UbiError):
    """A setting (a command-line flag or a ``UBI_*`` variable) has a value it cannot take; names which."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class StoreError(UbiError):
    """The DuckDB store could not be opened, read or written."""


class StoreLocked(StoreError):
    """Another process (usually a running collector) holds the store's write lock."""

