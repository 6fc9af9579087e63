"""At most one log line per interval about one kind of thing, with what was held back counted for the next.

A sender with a bug, or a page forging origins, can cause the same warning thousands of times a second; the
collector's warnings go through a :class:`LogThrottle` so that they say it once per interval and count the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class LogThrottle:
    """Says whether a log line may go now: at most one per ``every`` seconds of ``clock``."""

    every: float
    clock: Callable[[], float] = time.monotonic
    _last: float | None = None
    _held: int = 0

    def admit(self, now: float | None = None) -> tuple[bool, float | None, int]:
        """``(may log now, seconds since the last line logged or None before the first, lines held back since
        it)``; admitting a line starts the next interval and the next count."""
        now = self.clock() if now is None else now
        since = None if self._last is None else now - self._last
        if since is not None and since < self.every:
            self._held += 1
            return False, since, self._held
        held, self._last, self._held = self._held, now, 0
        return True, since, held

    def reset(self) -> None:
        """Forget the last line and the count: the next one is admitted."""
        self._last, self._held = None, 0
