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
