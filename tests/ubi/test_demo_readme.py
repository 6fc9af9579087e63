"""Every command the README lists for after `make demo` works on the demo's store and writes only into `demo-out/`, the
README's demo excerpt is what `make demo` prints, and `ubi demo --dir` deletes only a folder it made itself."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ubi.demo_support import DemoRun
from ubi_pipeline.cli import main
from ubi_pipeline.demo import MARKER

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands() -> list[str]:
    """The code block after the README's sentence about commands that work after `make demo`."""
    text = README.read_text(encoding="utf-8")
    start = text.index("so every command below works on\n`demo-out/ubi.duckdb` after `make demo`")
    block = re.search(r"```\n(.*?)```", text[start:], re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.startswith("ubi ")]


@pytest.fixture(scope="module")
def demo_dir(demo_runs: tuple[DemoRun, DemoRun], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the session's first demo run (300 searches: the size at which the HTML report used to crash on
    the propensity plot), as ``demo-out/`` of a fresh folder: the README's commands write into the store."""
    run = demo_runs[0]
    root = tmp_path_factory.mktemp("after-demo")
    shutil.copytree(run.dir, root / "demo-out")
    assert "Stored the catalog's 40 queries of human judgments" in run.stdout
    assert (root / "demo-out" / "report.html").read_text().startswith("<!DOCTYPE html>")
    (root / "demo-stdout.txt").write_text(run.stdout)
    return root


def test_demo_predicts_the_ranker_that_never_served(demo_dir: Path) -> None:
    """Issue 13: the demo's third ranker is a run file; the report predicts it and shows the joint view."""
    out = " ".join((demo_dir / "demo-stdout.txt").read_text().split())  # a console of 80 columns wraps lines
    run = demo_dir / "demo-out" / "unlogged-next.trec"
    # 40 catalog queries, the top 10 of each
    assert len(run.read_text().splitlines()) == 400
    assert "Predicted online metrics of the run systems (never served)" in out
    assert "unlogged-next − demo-shop/ranker=baseline" in out and "demo-shop/ranker=candidate − demo-shop/ranker=baseline" in out
    assert "exact expected CTR@10 on the logged searches is" in out
    # the terminal may fold long table cells; the HTML report never does
    html = (demo_dir / "demo-out" / "report.html").read_text()
    assert "<h2>Joint view: each pair of systems</h2>" in html and "unlogged-next never served (no log)" in html


def readme_demo_excerpt() -> list[str]:
    """The lines of the README's demo excerpt, without the "..." that mark what was left out."""
    text = README.read_text(encoding="utf-8")
    start = text.index("## What the demo prints (an excerpt)")
    block = re.search(r"```\n(.*?)```", text[start:], re.S)
    assert block is not None
    return [line.rstrip() for line in block.group(1).splitlines() if line.strip() and line.strip() != "..."]


def test_readme_demo_excerpt_is_what_make_demo_prints(tmp_path: Path) -> None:
    """The excerpt is real output of `make demo` (6,000 searches, seed 7: deterministic), not a stale copy.

    Every excerpt line, but its last character, starts a line of the output: the README cuts the joint view's last
    column for width, so its table lines are prefixes of the printed ones ending one box character early."""
    proc = subprocess.run([sys.executable, "-m", "ubi_pipeline", "demo", "--dir", str(tmp_path / "demo-out")],
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [line.rstrip() for line in proc.stdout.splitlines()]
    excerpt = readme_demo_excerpt()
    assert len(excerpt) >= 30 and any("implicit:pbm    526     396" in line for line in excerpt)
    missing = [line for line in excerpt if not any(out.startswith(line[:-1]) for out in printed)]
    assert not missing, "README demo excerpt lines the demo no longer prints:\n" + "\n".join(missing)


def test_readme_lists_the_commands() -> None:
    commands = readme_commands()
    assert len(commands) == 8 and any(c.startswith("ubi judgments export") for c in commands)


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_after_the_demo(demo_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys, command: str) -> None:
    monkeypatch.chdir(demo_dir)
    argv = shlex.split(command)[1:]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    # run from the repository root as written, a command may write into demo-out/ (git-ignored, emptied by the
    # next demo) and nowhere else
    assert sorted(p.name for p in demo_dir.iterdir()) == ["demo-out", "demo-stdout.txt"]
    if "--out" in argv:
        out = demo_dir / argv[argv.index("--out") + 1]
        assert out.parent == demo_dir / "demo-out"
        assert out.stat().st_size > 0
        if argv[:2] == ["judgments", "export"] and "workbench" in argv:
            doc = json.loads(out.read_text())
            # the 40 catalog queries, stored by the demo as human judgments
            assert doc["name"] == "demo judgments" and len(doc["judgmentRatings"]) == 40


def test_demo_dir_refuses_a_folder_it_did_not_make(tmp_path: Path, capsys) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "thesis.tex").write_text("years of it")
    assert main(["demo", "--dir", str(work), "--sessions", "50"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "the folder is not empty and was not made by `ubi demo`" in err and MARKER in err
    assert (work / "thesis.tex").read_text() == "years of it"
    afile = tmp_path / "f.txt"
    afile.write_text("x")
    assert main(["demo", "--dir", str(afile), "--sessions", "50"]) == 2
    assert afile.read_text() == "x"


def test_demo_dir_reuses_its_own_folder(tmp_path: Path) -> None:
    from ubi_pipeline.demo import prepare_workdir

    work = tmp_path / "demo-out"
    prepare_workdir(work)
    assert (work / MARKER).is_file()
    (work / "old-report.html").write_text("stale")
    prepare_workdir(work)  # made by the demo: emptied and marked again
    assert sorted(p.name for p in work.iterdir()) == [MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_workdir(empty)  # an empty folder is fine
    assert (empty / MARKER).is_file()


def test_demo_help_has_no_rest_markup(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "`ubi serve`" in out
