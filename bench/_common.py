"""What the benches share (not a bench itself): the closing line of wall time, CPU time and peak RSS."""

from __future__ import annotations

import gc
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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


def best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Best wall time and best CPU time (all threads of this process) over ``repeat`` calls."""
    wall, cpu, result = float("inf"), float("inf"), None
    for _ in range(repeat):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu, result
