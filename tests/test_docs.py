"""The documentation resolves: every ``docs/...`` path cited in the code and the docs exists, every link between
the Markdown files lands on a file and a heading, every file and module the docs name exists, and docs/settings.md lists
every setting with its default."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tests.docs_support import setting_default
from ubi_pipeline.schemas.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
#: where the code lives: the package folders, the benches, the tests, and the files that configure them
CODE_FOLDERS = ("schemas", "formats", "store", "transport", "collector", "loader", "processors", "reports", "review", "ubi",
                "bench", "tests")
CODE_FILES = ("pyproject.toml", "Makefile")
DOC_FILES = ("README.md", "CHANGELOG.md")
#: a cited path: ``docs/`` then a file name with an extension (``docs/metrics.md``), not a URL's path
CITATION = re.compile(r"(?<![\w/.-])docs/[\w./-]*\w\.\w+")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def code_files() -> list[Path]:
    files = [ROOT / name for name in CODE_FILES]
    for folder in CODE_FOLDERS:
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in {".py", ".js", ".html", ".toml"}]
    return files


def doc_files() -> list[Path]:
    return [ROOT / name for name in DOC_FILES] + sorted((ROOT / "docs").glob("**/*.md"))


def citations(path: Path) -> set[str]:
    return set(CITATION.findall(path.read_text(encoding="utf-8")))


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_the_citation_pattern_finds_what_it_must() -> None:
    # formats/qrels.py's docstring cites docs/metrics.md; a URL path such as prometheus.io/docs/... is no citation
    assert "docs/metrics.md" in citations(ROOT / "formats" / "qrels.py")
    assert citations(ROOT / "collector" / "metrics.py") == set()
    assert CITATION.findall("see ``docs/position-bias.md``, and docs/kafka.md.") == ["docs/position-bias.md",
                                                                                     "docs/kafka.md"]


def test_every_docs_path_cited_in_the_code_exists() -> None:
    cited = {(c, str(p.relative_to(ROOT))) for p in code_files() for c in citations(p)}
    # the help texts and docstrings cite at least these (issue 28: none of them existed)
    assert {"docs/ubi.md", "docs/metrics.md", "docs/position-bias.md", "docs/architecture.md"} <= {c for c, _ in cited}
    missing = sorted((c, where) for c, where in cited if not (ROOT / c).is_file())
    assert not missing, f"cited but not in the repository: {missing}"


def test_every_docs_path_cited_in_the_docs_exists() -> None:
    cited = {(c, str(p.relative_to(ROOT))) for p in doc_files() for c in citations(p)}
    assert len(cited) >= 10  # the README's "where to go next" alone names more
    missing = sorted((c, where) for c, where in cited if not (ROOT / c).is_file())
    assert not missing, f"cited but not in the repository: {missing}"


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_between_the_docs_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not broken, broken


def test_slug_follows_github() -> None:
    # the anchors the docs link to, as GitHub makes them
    assert slug("Reading a live store") == "reading-a-live-store"
    assert slug("Kafka: `ubi serve --sink kafka`, `ubi consume`") == "kafka-ubi-serve---sink-kafka-ubi-consume"
    assert slug("One writer, many readers") == "one-writer-many-readers"


def test_settings_page_lists_every_setting_with_its_default() -> None:
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `UBI_([A-Z0-9_]+)` \|.*$", page, re.M)}
    fields = {name.upper() for name in Settings.model_fields}
    assert sorted(fields - rows.keys()) == [], "settings missing from docs/settings.md"
    assert sorted(rows.keys() - fields) == [], "docs/settings.md lists settings that do not exist"
    wrong = [name for name in Settings.model_fields
             if rows[name.upper()].split(" | ")[1].strip() != setting_default(name)]
    assert not wrong, f"defaults that differ from schemas/settings.py: {wrong}"


def test_setting_default_renders_each_kind() -> None:
    assert setting_default("db") == "`ubi.duckdb`"
    assert setting_default("seal_dir") == "*unset*"
    assert setting_default("kafka_partitions") == "`6`"
    assert setting_default("click_actions") == '`["click"]`'
    assert setting_default("admin_remote") == "`false`"


def test_readme_is_for_users() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400
    # no history in the front door: no commit ids, branch names or diary
    assert not re.search(r"\b(this session|this branch|before \([0-9a-f]{7})", text, re.I)
    assert "source .venv/bin/activate" in text and ".venv/bin/ubi" in text


#: a repository path the docs name in passing: ``processors/clicks/sessions.py``, ``tests/ubi/``
REPO_PATH = re.compile(r"(?<![\w/.-])((?:" + "|".join(CODE_FOLDERS) + r")/[\w/.-]*\w)")
#: a module or an attribute of one: ``ubi_pipeline.store.sealed.FLUSH_ROWS``
MODULE_REF = re.compile(r"ubi_pipeline(?:\.\w+)+")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a module and attributes of it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_path_and_module_the_docs_name_exists() -> None:
    """The docs name real files and modules: a file moved or renamed in the code shows up here."""
    named = {(m, str(p.relative_to(ROOT))) for p in doc_files() for m in REPO_PATH.findall(p.read_text("utf-8"))}
    assert ("processors/clicks/sessions.py", "docs/architecture.md") in named
    assert not sorted(n for n in named if not (ROOT / n[0]).exists())
    modules = {(m, str(p.relative_to(ROOT))) for p in doc_files() for m in MODULE_REF.findall(p.read_text("utf-8"))}
    assert ("ubi_pipeline.store.sealed.FLUSH_ROWS", "docs/collector.md") in modules
    assert not sorted(n for n in modules if not resolves(n[0]))
    assert not resolves("ubi_pipeline.store.sealed.NO_SUCH_NAME") and not resolves("ubi_pipeline.nowhere")
