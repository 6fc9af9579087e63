"""The README's ten-minute tour, run as a user would: every command of it, as written, in a scratch folder, with the
installed ``ubi`` (issue 28: the README's commands left files in the repository root, and nothing ran them).

The tour has two ways in (``ubi import`` of files, or ``ubi serve`` and ``ubi simulate --post``); each test takes one
of them and then every later step. Between ``ubi review export`` and ``ubi review import`` the test plays the
assessor the README asks for: it fills the ``grade`` column with the suggested grades.
"""

from __future__ import annotations

import csv
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ubi_pipeline.cli import build_parser, main
from ubi_pipeline.store.client import advertised

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def tour_blocks() -> list[list[str]]:
    """The code blocks of the README's tour section, each as its lines."""
    text = README.read_text(encoding="utf-8")
    start = text.index("## A ten-minute tour on your own data")
    end = text.index("\n## ", start + 1)
    return [block.strip("\n").splitlines() for block in re.findall(r"```\n(.*?)```", text[start:end], re.S)]


def commands(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("ubi ")]


def tour(way_in: str) -> list[str]:
    """The tour's ``ubi`` commands in order, taking ``way_in`` ("import" or "serve") and leaving out the other."""
    other = {"import": "ubi serve ", "serve": "ubi import "}[way_in]
    out: list[str] = []
    for block in tour_blocks():
        cmds = commands(block)
        if cmds and not any(c.startswith(other) for c in cmds):
            out += cmds
    return out


def printed_output(after: str) -> str:
    """The README's code block that follows the sentence ``after``: a command's output, pasted."""
    text = README.read_text(encoding="utf-8")
    start = text.index(after)
    block = re.search(r"```\n(.*?)```", text[start:], re.S)
    assert block is not None
    return block.group(1)


def ubi_argv(command: str) -> list[str]:
    """A README line as the argv of the installed ``ubi`` (the console script beside this interpreter)."""
    script = Path(sys.executable).with_name("ubi")
    head = [str(script)] if script.exists() else [sys.executable, "-m", "ubi_pipeline"]
    return head + shlex.split(command)[1:]


ENV = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "COLUMNS": "200", "HOME": os.environ.get("HOME", "/tmp")}


def run(command: str, cwd: Path) -> str:
    proc = subprocess.run(ubi_argv(command), cwd=cwd, env=ENV, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def grade_like_an_assessor(sheet: Path) -> int:
    """Fill the review sheet's empty ``grade`` column with each row's suggested grade; the rows graded."""
    with sheet.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["grade"] = row["suggested_grade"]
    with sheet.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return sum(1 for row in rows if row["grade"] != "")


def repository_root() -> set[str]:
    return {p.name for p in ROOT.iterdir()}


def walk(steps: list[str], cwd: Path, runner=run) -> dict[str, str]:
    """Run the steps in ``cwd``; what each printed, by command."""
    printed = {}
    for command in steps:
        if command.startswith("ubi review import"):
            assert grade_like_an_assessor(cwd / "review.csv") > 0
        printed[command] = runner(command, cwd)
    return printed


def check_outputs(cwd: Path, printed: dict[str, str]) -> None:
    for name in ("report.md", "report.html", "pbm.qrels", "judgments.json", "review.csv", "ubi.duckdb"):
        assert (cwd / name).stat().st_size > 0, name
    assert (cwd / "report.md").read_text().startswith("# ")
    imported = next(out for cmd, out in printed.items() if cmd.startswith("ubi review import"))
    # 25 candidates of 5 queries; the one whose suggested grade is empty (no grade: too little evidence) stays so
    assert re.search(r"imported \d+ of 25 rows", imported), imported


def test_readme_tour_lists_both_ways_in() -> None:
    blocks = tour_blocks()
    assert blocks[0] == ["mkdir -p /tmp/ubi-tour && cd /tmp/ubi-tour"]
    steps = tour("import")
    assert steps[:2] == ["ubi simulate --sessions 2000 --seed 1 --out my-logs.ndjson --qrels my-judgments.jsonl",
                         "ubi import my-logs.ndjson"]
    assert tour("serve")[0] == "ubi serve --port 8000 &"
    # process, review, report, export: every stage of the tour after the way in
    for stage in ("ubi process", "ubi review export", "ubi review import", "ubi report", "ubi judgments export"):
        assert any(s.startswith(stage) for s in steps), stage
    # no command names a path outside the scratch folder it runs in
    outside = [t for s in tour("import") + tour("serve") for t in shlex.split(s) if t.startswith(("/", "..", "~"))]
    assert not outside


def test_readme_tour_with_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """In this process (``ubi_pipeline.cli.main``, imports paid once), from the scratch folder; the serve variant
    below runs the installed ``ubi`` script in subprocesses."""
    before = repository_root()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    for name in [k for k in os.environ if k.startswith("UBI_")]:
        monkeypatch.delenv(name)

    def in_process(command: str, cwd: Path) -> str:
        assert Path.cwd() == cwd
        code = main(shlex.split(command)[1:])
        out, err = capsys.readouterr()
        assert code == 0, f"`{command}` exited {code}:\n{err[-3000:]}"
        return out

    printed = walk(tour("import"), tmp_path, in_process)
    check_outputs(tmp_path, printed)
    # the output the README pastes is what the command prints, line for line
    assert printed["ubi process --model pbm"] == printed_output("On the simulated log, `ubi process --model pbm` prints:")
    assert repository_root() == before, "the tour wrote into the repository root"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: after the collector is up, the steps the serve variant runs beside it (the import variant runs every step): the
#: way in, then a writer of derived rows through the collector and a reader of its sealed segments
BESIDE_THE_COLLECTOR = ("ubi simulate", "ubi process", "ubi judgments import", "ubi report --format md")


def test_readme_tour_with_serve(tmp_path: Path) -> None:
    before = repository_root()
    port = free_port()
    steps = [s.replace("8000", str(port)) for s in tour("serve")]
    serve = steps[0]
    rest = [s for s in steps[1:] if s.startswith(BESIDE_THE_COLLECTOR)]
    assert serve.endswith(" &") and len(rest) == len(BESIDE_THE_COLLECTOR)
    log = (tmp_path.parent / "serve.log").open("wb")
    server = subprocess.Popen(ubi_argv(serve.removesuffix(" &")), cwd=tmp_path, env=ENV, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            # up once the sidecar names this server's pid: a port picked in advance may have been taken by
            # another program in between, whose server would answer the health check instead
            found = advertised(tmp_path / "ubi.duckdb")
            if found is not None and found[1] == server.pid:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
            assert server.poll() is None and time.monotonic() < deadline, "ubi serve did not come up"
            time.sleep(0.2)
        printed = walk(rest, tmp_path)
        assert (tmp_path / "report.md").read_text().startswith("# ")
        # the readers worked beside the running collector: it sealed the log for them, and the judgments went
        # back through it (the same counts as the import variant: 600 pairs of the 2,000 simulated searches)
        assert (tmp_path / "ubi.duckdb.sealed").is_dir()
        processed = next(out for cmd, out in printed.items() if cmd.startswith("ubi process"))
        assert processed.startswith("implicit:pbm: 600 pairs, 184 graded"), processed
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
    assert repository_root() == before, "the tour wrote into the repository root"


@pytest.mark.parametrize("way_in", ["import", "serve"])
def test_readme_tour_commands_parse(way_in: str) -> None:
    """Every tour command is one the CLI knows (a quick check before the slow runs above)."""
    parser = build_parser()
    for command in tour(way_in):
        parser.parse_args(shlex.split(command.removesuffix(" &"))[1:])
