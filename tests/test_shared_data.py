"""The one way the tests reach ``../shared``: a present file comes back, an absent one skips with its path."""

from __future__ import annotations

import pytest

import tests.conftest as shared_data


def test_a_present_file_is_returned_under_shared(tmp_path, monkeypatch):
    (tmp_path / "ubi-samples").mkdir()
    (tmp_path / "ubi-samples" / "x.json").write_text("{}")
    monkeypatch.setattr(shared_data, "SHARED", tmp_path)
    assert shared_data.shared_path("ubi-samples/x.json") == tmp_path / "ubi-samples" / "x.json"


def test_an_absent_file_skips_and_names_the_path(tmp_path, monkeypatch):
    monkeypatch.setattr(shared_data, "SHARED", tmp_path)
    with pytest.raises(pytest.skip.Exception, match=r"shared data is absent: .*ubi-samples/missing\.json"):
        shared_data.shared_path("ubi-samples/missing.json")


def test_the_fixture_skips_an_absent_file_the_same_way(shared):
    with pytest.raises(pytest.skip.Exception, match=r"shared data is absent: .*/shared/no-such-folder/x\.json"):
        shared("no-such-folder/x.json")
