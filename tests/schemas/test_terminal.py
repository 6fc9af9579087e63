"""``printable``: stored text shown on a terminal drives nothing (issue 28, item 4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ubi_pipeline.schemas.terminal import printable


@pytest.mark.parametrize(("stored", "shown"), [
    ("no such index [my_logs]", "no such index [my_logs]"),  # nothing to do: text and brackets kept
    ("\x1b[31mred\x1b[0m", "red"),  # CSI: colours
    ("\x1b[2J\x1b[H", ""),  # CSI: clear the screen, cursor home
    ("a\x1b]0;title\x07b", "ab"),  # OSC ended by BEL: window title
    ("x\x1b]8;;https://e.example\x1b\\link\x1b]8;;\x1b\\y", "xlinky"),  # OSC ended by ST: a hyperlink
    ("\x9b2Jz", "z"),  # the 8-bit CSI
    ("\x1bc reset", " reset"),  # a two-byte ESC sequence (full reset)
    ("a\rb\x08c\x7f", "a\\x0db\\x08c\\x7f"),  # lone controls shown, not acted on
    ("tab\tand\nnewline", "tab\tand\nnewline"),  # layout a table can show
])
def test_printable(stored: str, shown: str) -> None:
    assert printable(stored) == shown


@given(st.text())
def test_no_control_character_survives_and_printable_is_idempotent(text: str) -> None:
    out = printable(text)
    assert not any(ord(c) < 32 and c not in "\t\n" or 0x7F <= ord(c) <= 0x9F for c in out)
    assert printable(out) == out
