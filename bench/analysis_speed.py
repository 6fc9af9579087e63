"""Wall time and peak RSS of the analysis commands with their default bootstraps, beside the 60 s target.

Simulates the hard scenario (``ubi simulate --scenario hard``: 1,000 queries, 4 rankers, 5% crawlers) with
``--searches`` searches (default 50,000), imports it into a fresh store with ``ubi import``, then runs, each in
its own process: ``ubi propensity --method M --json --no-plot`` for every method the log allows (em, marginal,
harvest; randomized needs a swap experiment: ``--randomize``) and ``ubi predict --json`` of a candidate
ranker (the simulator's rule: each query's docs by grade + N(0, 0.5²), written as a JSONL run), all with their
defaults (200 bootstrap replicates). Prints per command the wall time, the child's CPU time and peak RSS
(``wait4``), the target and whether it was met. Issue 26 asked for every one within 60 s on 50,000 searches.

    .venv/bin/python bench/analysis_speed.py [--searches 50000] [--seed 1] [--methods em marginal harvest]
        [--randomize 0.1] [--replicates N] [--dir DIR]

``--replicates`` overrides the default bootstrap of every command (for a quick look; the target is for the
default). The machine may be shared: say so beside any figure taken on a busy one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ubi_pipeline.processors.counterfactual.validate import ranker_slots  # noqa: E402
from ubi_pipeline.processors.simulation import scenario, simulate  # noqa: E402

UBI = [sys.executable, "-m", "ubi_pipeline"]
TARGET_S = 60.0


def measured(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float, int, str]:
    """Wall time, the child's CPU time and peak RSS in MB (``wait4``), its exit code and its output."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read().decode(errors="replace")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), text


def report(step: str, res: tuple[float, float, float, int, str], target: float | None) -> None:
    wall, cpu, rss, code, text = res
    verdict = "" if target is None else ("met" if wall <= target else "MISSED")
    goal = "" if target is None else f"<= {target:.0f}"
    print(f"{step:<28} {wall:8.1f} {cpu:8.1f} {rss:9,.0f} {goal:>8} {verdict:>7}", flush=True)
    if code != 0:
        print(f"    ! exited {code}: {text[-800:]}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--searches", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--methods", nargs="+", default=["em", "marginal", "harvest"],
                    choices=["em", "marginal", "harvest", "randomized"])
    ap.add_argument("--randomize", type=float, default=0.0,
                    help="share of searches in a rank-1 swap experiment (needed by --methods randomized)")
    ap.add_argument("--no-predict", action="store_true", help="skip ubi predict")
    ap.add_argument("--replicates", type=int, help="bootstrap replicates of every command (default: theirs, 200)")
    ap.add_argument("--dir", type=Path, help="work folder (default: a temporary one, removed)")
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="ubi-analysis-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "UBI_SEED": "0"}
    try:
        config = scenario("hard", sessions=args.searches, seed=args.seed, randomize=args.randomize)
        traffic = simulate(config)
        log, db, run = work / "log.ndjson", work / "store.duckdb", work / "candidate.jsonl"
        traffic.write_bulk(log)
        cat = traffic.truth.catalog
        slots = ranker_slots(traffic.truth, 0.5, args.seed)
        with run.open("w") as fh:
            for q in range(cat.n_queries):
                fh.write(json.dumps({"query_id": cat.query_texts[q],
                                     "doc_ids": [str(cat.doc_ids[q, j]) for j in slots[q]]}) + "\n")
        print(f"hard scenario, {args.searches:,} searches (seed {args.seed}), {cat.n_queries} queries; "
              f"bootstrap replicates: {args.replicates or 'default (200)'}; {os.cpu_count()} cores, load "
              f"{os.getloadavg()[0]:.1f} at the start", flush=True)
        print(f"{'command':<28} {'wall s':>8} {'CPU s':>8} {'RSS MB':>9} {'target':>8} {'':>7}", flush=True)
        report("ubi import", measured([*UBI, "import", str(log), "--db", str(db), "--json"], env), None)
        boot = [] if args.replicates is None else ["--bootstrap", str(args.replicates)]
        for method in args.methods:
            cmd = [*UBI, "propensity", "--db", str(db), "--method", method, "--json", "--no-plot", *boot]
            report(f"ubi propensity {method}", measured(cmd, env), TARGET_S)
        if not args.no_predict:
            reps = [] if args.replicates is None else ["--replicates", str(args.replicates)]
            cmd = [*UBI, "predict", "--db", str(db), "--run", f"{run}=candidate", "--json", *reps]
            report("ubi predict", measured(cmd, env), TARGET_S)
        print(f"load {os.getloadavg()[0]:.1f} at the end (a shared machine: figures above it are upper bounds)")
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
