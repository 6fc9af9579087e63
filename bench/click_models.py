"""Fit time and peak memory of every click model on simulated logs (default 1,000,000 sessions x 10 ranks).

Usage: .venv/bin/python bench/click_models.py [--sessions 1000000] [--traffic pbm|dbn|cascade] [--models ...]

The log (1,000 queries x 20 docs, 3 rankers of differing noise, clicks from the chosen model) is simulated
and deduplicated once and saved to a temporary .npz; each model is then fitted in its own subprocess, which
reports the wall and CPU time of ``fit`` (including aggregation to cells for PBM/UBM; the machine is shared,
so wall time includes waiting for a core, CPU time does not), its EM iterations and empirical-prior rounds, and
its peak resident memory
(``VmHWM``, the whole process: Python, numpy, scipy, the loaded log and the fit). Targets (issue 10, 2 cores):
PBM <= 1.5 s, UBM <= 30 s, DBN <= 30 s, peak memory <= 1 GB. For context only, position-bias.md quotes PyClick
(pure-Python EM) at ~10,300 s for PBM and ~97,000 s for DBN, and CLAX (JAX) at 136 s / 270 s, on 10 M
Yandex sessions, a different machine and data set.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET_S = {"pbm": 1.5, "ubm": 30.0, "dbn": 30.0}  # issue 10: PBM <= 1.5 s, DBN <= 30 s, <= 1 GB
TARGET_MB = 1024.0

CHILD = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, {root!r})
from ubi_pipeline.processors.click_models import get_model
from ubi_pipeline.processors.clicks.stats import PairIndex, SessionPatterns
z = np.load({path!r}, allow_pickle=False)
n_pairs = int(z["n_pairs"])
pairs = PairIndex(np.array(["q"] * n_pairs, dtype=object), np.arange(n_pairs).astype(str).astype(object),
                  z["pair_query"])
s = SessionPatterns(pairs, z["query"], z["docs"], z["clicks"], z["weight"])
def peak_mb():
    # VmHWM is this process's own peak RSS; ru_maxrss would carry the parent's peak across fork+exec
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")
before = peak_mb()
model = get_model({name!r})
systems = None
if {systems!r} and "systems" in __import__("inspect").signature(model.fit).parameters:
    from ubi_pipeline.processors.clicks.stats import SystemRankings
    r = z["rankings"]
    systems = SystemRankings(tuple(f"ranker-{{j}}" for j in range(int(r[:, 1].max()) + 1)), r[:, 0], r[:, 1], r[:, 2:])
t0, c0 = time.perf_counter(), time.process_time()
model.fit(s) if systems is None else model.fit(s, systems)
fit_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
rel = model.relevance()
print(json.dumps({{"fit_s": fit_s, "cpu_s": cpu_s, "rss_before_mb": before,
                   "peak_mb": peak_mb(),
                   "iterations": getattr(model, "iterations", None),
                   "converged": getattr(model, "converged", None),
                   "prior_rounds": getattr(model, "prior_rounds", None),
                   "pairs_scored": int((rel.impressions > 0).sum())}}))
"""


def main() -> int:
    from _clicklog import simulate_log

    from ubi_pipeline.processors.click_models import MODEL_NAMES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=1_000_000)
    ap.add_argument(
        "--traffic", default="pbm", choices=["pbm", "dbn", "cascade"], help="click model generating the log"
    )
    ap.add_argument("--models", nargs="*", default=list(MODEL_NAMES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--systems", action="store_true",
                    help="give PBM and UBM the rankers that showed each ranking (their prior's systems' votes, as "
                         "`ubi process` does); the time includes the votes")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = ap.parse_args()

    import numpy as np

    t0 = time.perf_counter()
    s, truth = simulate_log(args.sessions, model=args.traffic, seed=args.seed)
    sim_s = time.perf_counter() - t0
    print(
        f"simulated + deduplicated {s.n_sessions:,} sessions x {s.max_rank} ranks ({args.traffic} clicks) "
        f"into {len(s.weight):,} patterns over {len(s.pairs):,} pairs in {sim_s:.1f} s",
        file=sys.stderr,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "log.npz")
        np.savez(
            path,
            query=s.query,
            docs=s.docs,
            clicks=s.clicks,
            weight=s.weight,
            pair_query=s.pairs.query_index,
            n_pairs=np.array(len(s.pairs)),
            rankings=truth["rankings"],
        )
        for name in args.models:
            code = CHILD.format(root=str(ROOT), path=path, name=name, systems=bool(args.systems))
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(f"{name}: failed\n{out.stderr}", file=sys.stderr)
                continue
            row = {"model": name, **json.loads(out.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(f"  {name}: {row['fit_s']:.2f} s", file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                {"sessions": s.n_sessions, "patterns": len(s.weight), "traffic": args.traffic,
                 "systems": bool(args.systems), "rows": rows},
                indent=2,
            )
        )
        return 0
    print(
        f"\nFit on {s.n_sessions:,} sessions x {s.max_rank} ranks ({len(s.weight):,} distinct patterns, "
        f"{args.traffic} traffic, {len(s.pairs):,} pairs)"
    )
    print(
        f"{'model':8s} {'fit s':>8s} {'cpu s':>8s} {'target':>7s} {'iters':>6s} {'rounds':>6s} {'conv':>5s} {'peak MB':>8s} "
        f"{'load MB':>8s}  ok"
    )
    for r in rows:
        target = TARGET_S.get(r["model"])
        ok = r["peak_mb"] <= TARGET_MB and (target is None or r["fit_s"] <= target)
        it = "" if r["iterations"] is None else str(r["iterations"])
        rounds = "" if r.get("prior_rounds") is None else str(r["prior_rounds"])
        conv = "" if r["converged"] is None else ("yes" if r["converged"] else "no")
        tgt = "" if target is None else f"{target:g}"
        print(
            f"{r['model']:8s} {r['fit_s']:8.2f} {r['cpu_s']:8.2f} {tgt:>7s} {it:>6s} {rounds:>6s} {conv:>5s} {r['peak_mb']:8.0f} "
            f"{r['rss_before_mb']:8.0f}  "
            f"{'yes' if ok else 'NO'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
