"""Stored text made safe to print on a terminal: what a client sent must not drive the reader's terminal."""

from __future__ import annotations

import re

# ECMA-48 sequences a terminal acts on: CSI (ESC [ or the 8-bit 0x9b: colours, cursor moves, clearing the screen),
# OSC (ESC ] ... BEL or ST: window titles, hyperlinks, clipboard writes) and the other two-byte ESC sequences.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]"
)
# What is left of the C0 and C1 controls and DEL once the sequences are gone (tab and newline are kept).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    r"""``text`` without terminal escape sequences, any other control character shown as ``\xNN``.

    ``"\x1b[31mred\x1b[0m\r"`` -> ``"red\x0d"`` (the ``\x0d`` as four visible characters). The sequences are
    dropped rather than shown because they are what would act; a lone control byte is shown, so that a record
    that holds one still looks different from one that does not. ``ubi failed --json`` keeps the text as stored.
    """
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", _SEQUENCE.sub("", text))
