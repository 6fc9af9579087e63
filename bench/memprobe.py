"""Where a ``ubi`` command's memory peaks: run it in this process with a sampler beside it.

A thread reads the process's resident set size (``/proc/self/statm``) every ``--every`` seconds and, each time
it passes the highest value seen by ``--step`` MiB, records the main thread's Python stack (the innermost
``--depth`` frames of package code). At the end it prints the peak, the stack at each new high, and the time
series of RSS by the report's steps, so a peak is placed in the code instead of guessed. ``--json FILE`` writes
the same as JSON.

    .venv/bin/python bench/memprobe.py [--every 0.05] [--step 64] -- report --db STORE --format json --out /dev/null

The sampler holds the GIL only to read one small file and walk one stack, so it changes the command's CPU time
by well under 1%; the peak it reports is sampled (a spike shorter than ``--every`` may be missed), and the
kernel's own peak (``VmHWM``) is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
ROOT = str(Path(__file__).resolve().parents[1])


def rss_mib() -> float:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[1]) * PAGE / 2**20


def hwm_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def package_stack(frame: object, depth: int) -> list[str]:
    """The innermost ``depth`` frames of the repository's own code (not the venv's), outermost first."""
    frames = [f for f in traceback.extract_stack(frame)  # type: ignore[arg-type]
              if f.filename.startswith(ROOT) and "/.venv/" not in f.filename]
    return [f"{Path(f.filename).relative_to(ROOT)}:{f.lineno} {f.name}" for f in frames[-depth:]]


class Sampler(threading.Thread):
    def __init__(self, every: float, step: float, depth: int) -> None:
        super().__init__(daemon=True)
        self.every, self.step, self.depth = every, step, depth
        self.main_id = threading.main_thread().ident
        self.highs: list[dict[str, object]] = []
        self.series: list[tuple[float, float]] = []
        self.peak = 0.0
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        last_recorded = 0.0
        last_series = -1.0
        while not self.stop.wait(self.every):
            rss = rss_mib()
            now = time.monotonic() - self.t0
            if now - last_series >= 1.0:
                self.series.append((round(now, 1), round(rss, 1)))
                last_series = now
            if rss > self.peak:
                self.peak = rss
                if rss >= last_recorded + self.step:
                    frame = sys._current_frames().get(self.main_id)  # type: ignore[arg-type]
                    self.highs.append({"t": round(now, 1), "rss_mib": round(rss, 1),
                                       "stack": package_stack(frame, self.depth) if frame else []})
                    last_recorded = rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=float, default=0.05, help="seconds between samples (default 0.05)")
    ap.add_argument("--step", type=float, default=64.0, help="record the stack each time RSS passes the last "
                                                             "recorded high by this many MiB (default 64)")
    ap.add_argument("--depth", type=int, default=6, help="package frames kept per stack (default 6)")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON to this file")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the ubi command and its arguments, after --")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the ubi command after --, e.g. -- report --db STORE --format json --out /dev/null")
    from ubi_pipeline.cli import main as ubi_main

    sampler = Sampler(args.every, args.step, args.depth)
    sampler.start()
    cpu0, t0 = time.process_time(), time.monotonic()
    try:
        rc = ubi_main(command)
    except SystemExit as exc:  # argparse and the CLI's own exits
        rc = exc.code if isinstance(exc.code, int) else 1
    sampler.stop.set()
    sampler.join()
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    out = {"command": command, "rc": rc, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
           "peak_sampled_mib": round(sampler.peak, 1), "vm_hwm_mib": round(hwm_mib(), 1),
           "highs": sampler.highs, "series": sampler.series}
    print(f"\nrc {rc}; wall {wall:.1f} s, CPU {cpu:.1f} s; peak RSS {sampler.peak:,.0f} MiB sampled, "
          f"{out['vm_hwm_mib']:,.0f} MiB VmHWM", file=sys.stderr)
    for h in sampler.highs:
        print(f"  {h['t']:>8} s {h['rss_mib']:>8,.0f} MiB  " + " > ".join(h["stack"][-3:]), file=sys.stderr)  # type: ignore[index]
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
