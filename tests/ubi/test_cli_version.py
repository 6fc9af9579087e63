"""``ubi --version`` and ``ubi -V`` (issue 28, item 4): the installed distribution's version, from its metadata."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag_prints_the_installed_version(flag: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "ubi_pipeline", flag], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # expected: what the installed distribution's metadata says (pyproject.toml's `version`, 0.1.0 when written)
    assert proc.stdout == f"ubi-pipeline {importlib.metadata.version('ubi-pipeline')}\n"
    assert proc.stderr == ""
