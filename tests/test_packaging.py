"""The package metadata builds without setuptools' deprecation warnings (issue 12, item 7)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_license_is_an_spdx_string_and_setuptools_can_read_it() -> None:
    doc = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    # a TOML table ({text = ...}) makes setuptools >= 77 print "`project.license` as a TOML table is deprecated"
    assert doc["project"]["license"] == "Apache-2.0"
    assert not any(c.startswith("License ::") for c in doc["project"].get("classifiers", []))  # PEP 639 forbids both
    # the SPDX string form needs setuptools 77 (PEP 639 support); an older one would reject the file
    (req,) = [r for r in doc["build-system"]["requires"] if r.startswith("setuptools")]
    minimum = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", req.replace(" ", ""))
    assert minimum is not None and int(minimum.group(1)) >= 77


# --- one import package (issue 28) ---------------------------------------------------------------------------
import ast  # noqa: E402

ROOT = PYPROJECT.parent
#: the repository's top-level folders that hold the package's code, and the subpackage each installs as
FOLDERS = {"ubi": "ubi_pipeline", "schemas": "ubi_pipeline.schemas", "formats": "ubi_pipeline.formats",
           "store": "ubi_pipeline.store", "transport": "ubi_pipeline.transport",
           "collector": "ubi_pipeline.collector", "loader": "ubi_pipeline.loader",
           "processors": "ubi_pipeline.processors", "reports": "ubi_pipeline.reports",
           "review": "ubi_pipeline.review"}


def test_every_folder_installs_under_the_one_import_package() -> None:
    doc = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    setuptools = doc["tool"]["setuptools"]
    assert setuptools["package-dir"] == {v: k for k, v in FOLDERS.items()}
    found = set()
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    # a package folder missing from the list would be left out of a wheel (an editable install still finds it)
    assert set(setuptools["packages"]) == found
    assert all(p == "ubi_pipeline" or p.startswith("ubi_pipeline.") for p in found)


def test_nothing_imports_the_folders_as_top_level_packages() -> None:
    # the repository root is on the tests' sys.path (pytest's pythonpath, for `tests.*`), so `import schemas` would
    # still work here although no installed copy has it: every import goes through ubi_pipeline
    old = set(FOLDERS)
    offenders = []
    for folder in [*FOLDERS, "tests", "bench"]:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                         else [])
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                              if n.split(".")[0] in old]
    assert offenders == []
