"""``ubi demo``: the whole pipeline in one command, on the embedded store, offline and deterministic.

It starts a real collector process (``ubi serve``) on a fresh DuckDB file and a free loopback port, sends
simulated traffic over HTTP (the built-in catalog with graded human judgments, two rankers, position-biased
clicks), derives candidate judgments with several click models *while the collector keeps running* (the
one-writer design of ``store/duckdb_store.py``, docs/collector.md), estimates position bias, and prints the joint report, in which
a third ranker that never served (a run file the demo writes from its catalog) gets its online metrics
predicted from the logs and every pair of rankers its joint view. Same seed, same report. ``--serve`` instead serves the instrumented demo search page.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from ubi_pipeline.schemas.errors import UbiError
from ubi_pipeline.stages import main as ubi_main

#: Click models the demo derives candidate judgments with (each becomes a source ``implicit:<model>``).
DEMO_MODELS = ("ctr", "coec", "pbm", "dbn")
RANKERS = ("baseline", "candidate")
RANKER_NOISE = (1.5, 0.7)
#: The third ranker, which never serves: the demo writes its run file from the catalog and the report predicts
#: its online metrics from the two logged rankers' traffic. Its noise σ is below both logged rankers' (better).
UNLOGGED = "unlogged-next"
UNLOGGED_NOISE = 0.3


class DemoError(UbiError):
    """The demo could not run (collector did not start, a stage failed)."""


@contextlib.contextmanager
def running_collector(db: Path, port: int = 0, log: Path | None = None) -> Iterator[str]:
    """Run ``ubi serve`` as its own process until the block ends; yield its base URL.

    ``port`` 0 (the default) lets the collector bind a free port itself. The URL is the one the started process
    advertises beside ``db`` (the sidecar carries its pid), never a guess: a port picked beforehand can be taken
    by another program before the collector binds it, and a health check on that port would then reach the
    other program's server (the collector itself exits with "address already in use").
    """
    import httpx

    from ubi_pipeline.store.client import advertised

    log = log if log is not None else db.with_name(db.name + ".collector.log")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ubi_pipeline", "serve", "--db", str(db), "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                if proc.poll() is not None:
                    raise DemoError(f"the collector exited with code {proc.returncode}; see {log}")
                found = advertised(db)
                url = found[0] if found is not None and found[1] == proc.pid else None  # a stale one: another pid
                if url is not None:
                    try:
                        if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                if time.monotonic() > deadline:
                    raise DemoError(f"the collector did not come up within 30 s; see {log}")
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _step(console: Console, text: str) -> None:
    console.print(f"\n[bold cyan]==>[/] [bold]{text}[/]")


def _run(argv: list[str]) -> None:
    code = ubi_main(argv)
    if code != 0:
        raise DemoError(f"`ubi {' '.join(argv)}` exited with code {code}")


#: The file ``ubi demo`` writes into its work folder: only a folder holding it is ever deleted by a later run.
MARKER = ".ubi-demo"


def prepare_workdir(workdir: Path) -> None:
    """Make ``workdir`` a fresh demo folder: delete it only when an earlier ``ubi demo`` made it (its
    :data:`MARKER` is there); refuse any other non-empty folder, or a file, rather than delete real work."""
    if workdir.exists() and not workdir.is_dir():
        raise DemoError(f"--dir {workdir}: is a file, not a folder; give a new or empty folder")
    if workdir.is_dir():
        if (workdir / MARKER).is_file():
            shutil.rmtree(workdir)
        elif any(workdir.iterdir()):
            raise DemoError(f"--dir {workdir}: the folder is not empty and was not made by `ubi demo` (it has no "
                            f"{MARKER} file), so the demo will not delete it; give a new or empty folder")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / MARKER).write_text("made by `ubi demo`; a later `ubi demo --dir` on this folder deletes it\n",
                                  encoding="utf-8")


def unlogged_slots(catalog: Any, *, noise: float = UNLOGGED_NOISE, seed: int = 0, depth: int = 10) -> Any:
    """[Q, depth] doc slots of a ranker that never served: each catalog query's docs by grade + N(0, σ²)
    (the simulator's ranker protocol, ``ubi_pipeline.processors.simulation.traffic``)."""
    import numpy as np

    rng = np.random.default_rng([seed, 0x0A11])
    score = catalog.grades + rng.normal(0.0, noise, size=catalog.grades.shape)
    return np.argsort(-score, axis=1, kind="stable")[:, :depth]


def write_run(catalog: Any, slots: Any, path: Path, tag: str = UNLOGGED) -> int:
    """The ranker's lists as a TREC run (score: depth − rank + 1); returns the number of lines."""
    depth = slots.shape[1]
    lines = [f"{qid} Q0 {catalog.doc_ids[q, j]} {r} {depth - r + 1} {tag}"
             for q, qid in enumerate(catalog.query_ids) for r, j in enumerate(slots[q].tolist(), 1)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def run_demo(args: argparse.Namespace) -> int:
    """The main job, shown in one command."""
    from ubi_pipeline.processors.simulation import SimConfig, simulate
    console = Console(highlight=False)
    workdir = Path(args.dir)
    prepare_workdir(workdir)
    db = workdir / "ubi.duckdb"
    qrels = workdir / "qrels.jsonl"
    truth_file = workdir / "truth.json"
    html = workdir / "report.html"
    propensity_json = workdir / "propensity.json"
    unlogged_run = workdir / f"{UNLOGGED}.trec"

    traffic = simulate(SimConfig(sessions=args.sessions, seed=args.seed, rankers=2, ranker_names=RANKERS,
                                 ranker_noise=RANKER_NOISE, application="demo-shop"))
    catalog = traffic.truth.catalog
    slots = unlogged_slots(catalog, seed=args.seed)
    write_run(catalog, slots, unlogged_run)
    traffic.write_qrels(qrels)
    traffic.write_truth(truth_file)
    summary = traffic.summary()

    console.print("[bold]ubi-pipeline demo[/]: UBI traffic in over HTTP, durable in DuckDB, click models, "
                  "candidate judgments with their evidence, and a joint online + offline report.")
    console.print(f"Work folder: {workdir}/ (store, human judgments, truth, HTML report)")

    with running_collector(db, 0, workdir / "collector.log") as url:
        _step(console, f"Collector running at {url}, storing into {db}")
        console.print(f"Simulated shop: {summary['queries']} queries, {summary['sessions']:,} searches, "
                      f"{summary['clicks']:,} clicks; rankers {', '.join(RANKERS)} "
                      "(position-biased clicks, θ_k = 1/k).")
        posted = traffic.post(url)
        console.print(f"Sent over HTTP: {posted.accepted:,} records accepted, {posted.duplicates:,} duplicates, "
                      f"{posted.rejected:,} rejected.")
        if posted.rejected:
            raise DemoError(f"the collector rejected {posted.rejected} simulated records; see `ubi failed --db {db}`")
        # the catalog's human judgments go into the store too (through the running collector), so that every
        # command after the demo (`ubi judgments export`, `ubi report` without --qrels) finds them
        with contextlib.redirect_stdout(io.StringIO()):
            _run(["judgments", "import", str(qrels), "--db", str(db), "--assessor", "simulator",
                  "--rubric", "simulated grades of the demo catalog"])
        console.print(f"Stored the catalog's {summary['queries']} queries of human judgments ({qrels.name}) as "
                      "source human.")

        _step(console, "Candidate judgments, derived while the collector keeps running")
        table = Table("source", "pairs", "graded", "grades 0/1/2/3", "grade mapping", box=box.SIMPLE_HEAD)
        first: dict[str, Any] | None = None
        for model in DEMO_MODELS:
            summary_json = io.StringIO()
            with contextlib.redirect_stdout(summary_json):
                _run(["process", "--db", str(db), "--model", model, "--json"])
            done = json.loads(summary_json.getvalue())
            first = first or done
            counts = done["grade_counts"]
            table.add_row(done["source"], f"{done['pairs']:,}", f"{done['graded']:,}",
                          "/".join(str(counts.get(str(g), 0)) for g in range(4)),
                          f"{done['mapping']['kind']}: " + ", ".join(f"{t:.3g}" for t in done["mapping"]["thresholds"]))
        if first is not None:
            f, q = first["sessions"], first["quality"]
            console.print(f"Sessions: {f['sessions']:,} fitted ({f['impressions']:,} impressions, {f['clicks']:,} clicks "
                          f"within rank 10); filtered {f['bot_searches']:,} bot searches, {f['click_all_searches']:,} "
                          f"click-on-everything searches; {q['click_rank_disagreements']:,} of "
                          f"{q['click_rank_checked']:,} click ordinals disagree with the ranking.")
        console.print(table)
        console.print(f"A pair gets a grade only with at least {first['min_support'] if first else 10} observations "
                      "under its model and a 95% interval no wider than 0.5; every row keeps score, interval and support.")

        _step(console, "Position bias: θ_k/θ_1 from PBM EM, with bootstrap intervals, against the simulated truth")
        _run(["propensity", "--db", str(db), "--method", "em", "--bootstrap", "100", "--truth", str(truth_file),
              "--plot", str(workdir / "propensity.png")])
        with propensity_json.open("w") as out, contextlib.redirect_stdout(out):
            _run(["propensity", "--db", str(db), "--method", "em", "--bootstrap", "100", "--no-plot", "--json"])

        _step(console, f"Joint report: both rankers and {UNLOGGED}, a third that never served (a run file: "
                       f"grade + N(0, {UNLOGGED_NOISE}²)), offline on human and implicit labels, online, predicted "
                       "online, agreement, the joint view")
        _run(["report", "--db", str(db), "--baseline", f"demo-shop/ranker={RANKERS[0]}",
              "--run", f"{unlogged_run}={UNLOGGED}", "--predict-replicates", "50",  # not CPU-budgeted: same seed, same report
              "--propensity", str(propensity_json), "--html", str(html)])
        _truth_line(console, traffic, slots)
    console.print(f"\nHTML report: {html}")
    return 0


def _truth_line(console: Console, traffic: Any, slots: Any) -> None:
    """What the simulator knows and the report had to predict: the unlogged ranker's exact CTR@10."""
    from ubi_pipeline.processors.counterfactual.validate import exact_metrics

    if traffic.truth.config.model not in ("pbm", "cascade", "dbn"):
        return
    exact = exact_metrics(traffic.truth, traffic.query, slots[traffic.query])["ctr@k"]
    logged = {name: exact_metrics(traffic.truth, traffic.query[traffic.ranker == r],
                                  traffic.slots[traffic.ranker == r])["ctr@k"] for r, name in enumerate(RANKERS)}
    console.print(f"\nThe simulator's truth, which the report did not see: {UNLOGGED}'s exact expected CTR@10 on the "
                  f"logged searches is {exact:.3f} (the prediction above estimates it); "
                  + ", ".join(f"{n} {v:.3f}" for n, v in logged.items()) + " for the logged rankers.")


#: ``ubi demo --help``: the module docstring without reST markup (argparse prints it as it is).
_HELP = (__doc__ or "").replace("``", "`")


def cmd_demo(args: argparse.Namespace) -> int:
    if not args.serve and any(getattr(args, name) is not None for name in ("host", "port", "db")):
        raise DemoError("--host, --port and --db are for `ubi demo --serve`; the batch demo uses a free "
                        "loopback port and <--dir>/ubi.duckdb")
    if args.serve:
        from ubi_pipeline.demo_serve import serve_demo

        return int(serve_demo(args) or 0)
    return run_demo(args)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline on simulated traffic and print the joint report (offline, deterministic)",
        description=_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dir", default="demo-out",
                   help=f"work folder (default demo-out): created, or emptied when an earlier demo made it (it "
                        f"holds {MARKER}); any other non-empty folder is refused")
    p.add_argument("--sessions", type=int, default=6000, help="simulated searches (default 6000)")
    p.add_argument("--seed", type=int, default=7, help="simulation seed (default 7)")
    p.add_argument("--serve", action="store_true",
                   help="serve the instrumented demo search page and live report instead")
    serve = p.add_argument_group("--serve options")
    serve.add_argument("--host", help="address the demo page listens on (default 127.0.0.1)")
    serve.add_argument("--port", type=int,
                       help="port of the demo page (default 8000; 0 picks a free one, printed at start)")
    serve.add_argument("--db", type=Path, help="DuckDB file for what visitors do (default <--dir>/serve.duckdb)")
    p.set_defaults(func=cmd_demo)
