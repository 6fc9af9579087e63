"""Benchmark: offline evaluation of 100,000 queries x 100 ranked docs, ours beside ranx in the same run.

    .venv/bin/python bench/evaluate.py [--queries 100000] [--depth 100] [--judged 30] [--repeat 3] [--files]

Synthetic, seeded data: each query ranks ``depth`` distinct docs; ``judged`` docs per query carry grades
0-3, two thirds of them among the ranked docs, the rest unranked (so ideal DCG and recall see judged docs the
run missed). Scores strictly decrease with rank, so ranx (which breaks ties arbitrarily) and we rank alike.

Timings (best of ``--repeat``, wall clock and CPU time of this process, on a machine others may share):
- ours: ``ubi_pipeline.reports.metrics.compute`` from plain dicts (validation included: grades and duplicate doc ids) and
  from loader-validated ``Qrels`` / ``Run`` objects (those checks skipped), single-threaded numpy.
- ranx: ``ranx.evaluate`` on the same metrics after building its ``Qrels`` / ``Run`` (timed apart). ranx
  compiles with numba on first use and runs its kernels in parallel threads; the JIT warm-up (one evaluate
  on a tiny input first) is excluded from its time and printed separately.
Every per-query value is compared with ranx's; the largest difference is printed.
``--files`` also times reading a TREC run file of the same size (ours vs ranx ``Run.from_file``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from _common import best_of  # bench/_common.py, the script's folder
from rich.console import Console
from rich.table import Table

from ubi_pipeline.formats.qrels import Qrels
from ubi_pipeline.formats.runs import Run, load_trec_run
from ubi_pipeline.reports.metrics import compute

# ours -> ranx names, for the metrics both have (ranx has no judged@k)
SHARED = {"ndcg@10": "ndcg@10", "recall@10": "recall@10", "mrr": "mrr", "map": "map", "p@5": "precision@5",
          "ndcg_exp@10": "ndcg_burges@10"}


def make_data(n_queries: int, depth: int, judged: int, seed: int) -> tuple[dict, dict]:
    """Seeded qrels (query -> {doc: grade}) and runs (query -> ranked docs)."""
    rng = np.random.default_rng(seed)
    # distinct docs per query: a random offset plus a permutation of 0..2*depth-1, cut to depth
    offsets = rng.permuted(np.broadcast_to(np.arange(2 * depth), (n_queries, 2 * depth)), axis=1)
    doc_numbers = rng.integers(0, 10**7, n_queries)[:, None] + offsets
    ranked_n = (judged * 2) // 3
    grades = rng.choice(4, size=(n_queries, judged), p=[0.4, 0.3, 0.2, 0.1]).tolist()
    picks = rng.permuted(np.broadcast_to(np.arange(depth), (n_queries, depth)), axis=1)[:, :ranked_n]
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, list[str]] = {}
    for i, row in enumerate(doc_numbers.tolist()):
        docs = [f"d{x}" for x in row]
        q = f"q{i}"
        run[q] = docs[:depth]
        judged_docs = [docs[j] for j in picks[i]] + docs[depth : depth + judged - ranked_n]
        qrels[q] = dict(zip(judged_docs, grades[i], strict=True))
    return qrels, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--judged", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--files", action="store_true", help="also time reading a TREC run file of this size")
    ap.add_argument("--no-ranx", action="store_true")
    args = ap.parse_args()
    console = Console()
    shared = list(SHARED)
    default = "ndcg@10,recall@10,mrr,map,p@5,judged@10"

    t0 = time.perf_counter()
    qrels, run = make_data(args.queries, args.depth, args.judged, args.seed)
    n_docs = sum(map(len, run.values()))
    console.print(f"data: {args.queries:,} queries x {args.depth} docs = {n_docs:,} ranked, "
                  f"{sum(map(len, qrels.values())):,} judgments (generated in {time.perf_counter() - t0:.1f} s)")

    rows: list[tuple[str, str, float, float]] = []
    wall, cpu, table = best_of(args.repeat, lambda: compute(qrels, run, shared))
    rows.append(("ours: compute(), plain dicts, validated", ", ".join(shared), wall, cpu))
    q_obj, r_obj = Qrels(grades=qrels), Run(rankings=run)
    wall, cpu, _ = best_of(args.repeat, lambda: compute(q_obj, r_obj, shared))
    rows.append(("ours: compute(), loader-validated Qrels/Run", ", ".join(shared), wall, cpu))
    wall, cpu, _ = best_of(args.repeat, lambda: compute(qrels, run, default))
    rows.append(("ours: compute(), plain dicts, default set", default, wall, cpu))

    agreement = "ranx not run"
    if not args.no_ranx:
        import ranx

        warnings.filterwarnings("ignore", module="ranx")
        warnings.filterwarnings("ignore", category=Warning, message=".*unsafe cast.*")
        ranx_names = [SHARED[m] for m in shared]
        tiny_q = ranx.Qrels({"q": {"a": 1, "b": 2}})
        tiny_r = ranx.Run({"q": {"a": 2.0, "b": 1.0}})
        wall, cpu, _ = best_of(1, lambda: ranx.evaluate(tiny_q, tiny_r, ranx_names))
        warmup = ("ranx: JIT warm-up on a tiny input (excluded above)", "", wall, cpu)
        scores = {q: {d: float(args.depth - r) for r, d in enumerate(docs)} for q, docs in run.items()}
        wall, cpu, (rq, rr) = best_of(1, lambda: (ranx.Qrels(qrels), ranx.Run(scores)))
        rows.append(("ranx: build Qrels + Run from dicts", "", wall, cpu))
        wall, cpu, _ = best_of(args.repeat, lambda: ranx.evaluate(rq, rr, ranx_names, return_mean=False))
        rows.append(("ranx: evaluate() (numba, parallel, JIT excluded)", ", ".join(ranx_names), wall, cpu))
        rows.append(warmup)
        ranx.evaluate(rq, rr, ranx_names)  # fills rr.scores per query
        ids = table.query_ids
        worst = 0.0
        for ours, theirs in SHARED.items():
            ref = np.fromiter((rr.scores[theirs][q] for q in ids), np.float64, len(ids))
            worst = max(worst, float(np.abs(ref - table[ours]).max()))
        agreement = (f"largest |ours - ranx| over {len(ids):,} queries x {len(SHARED)} metrics: {worst:.1e} "
                     f"({len(table.negative_query_ids):,} labelled negatives reported apart)")
        del scores, rq, rr

    if args.files:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.run"
            with path.open("w") as fh:
                for q, docs in run.items():
                    fh.write("".join(f"{q} Q0 {d} {r} {args.depth - r} bench\n" for r, d in enumerate(docs, 1)))
            size = path.stat().st_size / 1e6
            wall, cpu, _ = best_of(1, lambda: load_trec_run(path))
            rows.append((f"ours: load_trec_run ({size:.0f} MB)", "", wall, cpu))
            if not args.no_ranx:
                import ranx

                wall, cpu, _ = best_of(1, lambda: ranx.Run.from_file(str(path), kind="trec"))
                rows.append((f"ranx: Run.from_file ({size:.0f} MB)", "", wall, cpu))

    out = Table(title=f"evaluation, {args.queries:,} queries x {args.depth} docs (best of {args.repeat})",
                title_justify="left")
    out.add_column("what")
    out.add_column("metrics")
    out.add_column("wall s", justify="right")
    out.add_column("CPU s", justify="right")
    for what, metrics, wall, cpu in rows:
        out.add_row(what, metrics, f"{wall:.2f}", f"{cpu:.2f}")
    console.print(out)
    console.print(f"load average while running: {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
                  f"on {os.cpu_count()} cores (other jobs inflate wall time; CPU time sums ranx's threads)")
    console.print(agreement)


if __name__ == "__main__":
    main()
