"""What the benches share (not a bench itself): the closing line of wall time, CPU time and peak RSS."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Usage:
    """Wall and CPU clocks started when this is made; :meth:`line` is what a bench prints last."""

    wall0: float = field(default_factory=time.perf_counter)
    cpu0: float = field(default_factory=time.process_time)

    def line(self) -> str:
        """``wall W s, CPU C s, peak RSS R MB (shared machine)`` since this was made (RSS: the process's peak)."""
        wall, cpu = time.perf_counter() - self.wall0, time.process_time() - self.cpu0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return f"wall {wall:.0f} s, CPU {cpu:.0f} s, peak RSS {rss:.0f} MB (shared machine)"
