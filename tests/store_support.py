"""Checks shared by the tests that read a store a collector or loader holds."""

from __future__ import annotations

from pathlib import Path

from ubi_pipeline.store.sealed import MANIFEST, default_root


def only_store_files(db: Path) -> bool:
    """Whether everything named after ``db`` is the store's own: the file, its WAL and spill folder, the
    sidecar, the collector's answer log, and the seal folder, whose manifest names every segment in it (a reader that read through the
    collector found it there, and left no copy of its own)."""
    allowed = {db.name, db.name + ".wal", db.name + ".tmp", db.name + ".collector.json", db.name + ".sealed",
               db.name + ".answers"}
    present = {p.name for p in db.parent.glob(db.name + "*")}
    root = default_root(db)
    if not (root / MANIFEST).exists():
        raise AssertionError(f"{root / MANIFEST} missing: the readers did not read sealed segments")
    if not present <= allowed:
        raise AssertionError(f"files beside {db} that are not the store's: {sorted(present - allowed)}")
    return True
