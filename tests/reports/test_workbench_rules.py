"""Workbench exports the Workbench accepts (issue 12, item 5).

The rules are the Search Relevance Workbench's own (opensearch-project/search-relevance,
utils/TextValidationUtil.java): name <= 50 and description <= 250 UTF-16 code units, not empty, none of
the characters " \\ < >. Its import of the ESCI-style export answered 400 "Invalid description" for the old
default description "Exported by ubi-pipeline: source merged (human > reviewed > implicit)".
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from joint_fixtures import build_store, write_human

from ubi_pipeline.cli import main
from ubi_pipeline.formats.qrels import (
    WORKBENCH_DESCRIPTION_MAX,
    WORKBENCH_NAME_MAX,
    WorkbenchTextError,
    check_workbench_text,
    workbench_safe,
    workbench_text_problem,
)

# The Workbench's test, transcribed: text.matches(".*[\"\\\\<>]+.*"), length in UTF-16 units, not empty
# (its request parsing trims and treats blank as absent).
_SRW_DANGEROUS = re.compile(r'["\\<>]')


def srw_accepts(text: str, max_len: int) -> bool:
    return bool(text.strip()) and len(text.encode("utf-16-le")) // 2 <= max_len and not _SRW_DANGEROUS.search(text)


@given(st.text(max_size=300))
def test_our_rule_is_the_workbench_rule(text: str) -> None:
    for max_len in (WORKBENCH_NAME_MAX, WORKBENCH_DESCRIPTION_MAX):
        assert (workbench_text_problem(text, max_len) is None) == srw_accepts(text, max_len)


@given(st.text(max_size=400))
def test_generated_descriptions_are_always_accepted(text: str) -> None:
    assert srw_accepts(workbench_safe(text), WORKBENCH_DESCRIPTION_MAX)


def test_messages_name_the_field_and_the_rule() -> None:
    with pytest.raises(WorkbenchTextError, match=r"""--name 'a "b"' contains ", which the Workbench does not allow"""):
        check_workbench_text('a "b"', "--name", WORKBENCH_NAME_MAX)
    with pytest.raises(WorkbenchTextError, match=r"is 51 characters long; at most 50"):
        check_workbench_text("x" * 51, "--name", WORKBENCH_NAME_MAX)
    # a character outside the BMP is two UTF-16 units, as Java's String.length() counts it
    assert workbench_text_problem("\U0001F600" * 25, WORKBENCH_NAME_MAX) is None
    assert workbench_text_problem("\U0001F600" * 26, WORKBENCH_NAME_MAX) == "is 52 characters long; at most 50"


@pytest.fixture()
def store(tmp_path):
    db = build_store(tmp_path / "ubi.duckdb")  # implicit:ctr labels (joint_fixtures)
    assert main(["judgments", "import", str(write_human(tmp_path / "h.jsonl")), "--db", str(db)]) == 0
    return db


@pytest.mark.parametrize("source", ["human", "merged", "implicit:ctr", "ctr"])
def test_every_export_passes_the_workbench_rules(store, tmp_path, source) -> None:
    out = tmp_path / "wb.json"
    assert main(["judgments", "export", "--db", str(store), "--source", source, "--format", "workbench",
                 "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert srw_accepts(doc["name"], WORKBENCH_NAME_MAX) and srw_accepts(doc["description"], WORKBENCH_DESCRIPTION_MAX)
    if source == "merged":
        assert doc["description"] == ("Exported by ubi-pipeline from source merged, precedence human then reviewed "
                                      "then implicit")


@pytest.mark.parametrize("name", ['my "best" list', "a<b", "back\\slash", "", "n" * 51])
def test_a_refused_name_exits_2(store, tmp_path, capsys, name) -> None:
    out = tmp_path / "wb.json"
    assert main(["judgments", "export", "--db", str(store), "--format", "workbench", "--name", name,
                 "--out", str(out)]) == 2
    assert "the Search Relevance Workbench would refuse the file with 400" in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_queryset_names_are_checked_too(store, tmp_path, capsys) -> None:
    assert main(["queryset", "--db", str(store), "--size", "2", "--format", "workbench", "--name", "<script>"]) == 2
    assert "name '<script>' contains < >" in " ".join(capsys.readouterr().err.split())
