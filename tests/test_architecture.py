"""The floor plan holds: dependencies point one way, no circle, no private name crosses a file (issue 28).

The layers, bottom first (docs/architecture.md): a module may import its own layer's modules and those of the
layers below, never above. Imports inside functions count as much as those at the top: a lazy import does not
make an arrow point the right way.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: folder -> package, as pyproject.toml's package-dir maps them (tests/test_packaging.py checks that mapping)
FOLDERS = {"ubi": "ubi_pipeline", "schemas": "ubi_pipeline.schemas", "formats": "ubi_pipeline.formats",
           "store": "ubi_pipeline.store", "transport": "ubi_pipeline.transport",
           "collector": "ubi_pipeline.collector", "loader": "ubi_pipeline.loader",
           "processors": "ubi_pipeline.processors", "reports": "ubi_pipeline.reports",
           "review": "ubi_pipeline.review"}
#: the layers, bottom first; within processors, its rooms are layered too
LAYERS = [
    ("ubi_pipeline.schemas",),
    ("ubi_pipeline.formats",),
    ("ubi_pipeline.store",),
    ("ubi_pipeline.transport",),
    ("ubi_pipeline.collector", "ubi_pipeline.loader"),
    ("ubi_pipeline.processors.clicks",),
    ("ubi_pipeline.processors.click_models",),
    ("ubi_pipeline.processors.propensity",),
    ("ubi_pipeline.processors.simulation",),
    ("ubi_pipeline.processors.labels",),
    ("ubi_pipeline.processors.counterfactual",),
    ("ubi_pipeline.reports",),
    ("ubi_pipeline.review",),  # the human loop: the review page over the queue
    ("ubi_pipeline",),  # the CLI: cli.py, stages.py, commands/, the demo
]


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if folder == "ubi" and parts and parts[0] in FOLDERS:  # not reached: folders are siblings of ubi/
                continue
            found[".".join([package, *parts])] = path
    return found


def layer(module: str) -> int:
    best, index = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, index = len(name), i
    return index


def imports(path: Path, known: dict[str, Path]) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, names) for every import of ours in ``path``, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.startswith("ubi_pipeline")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("ubi_pipeline"):
            module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                out.append((node.lineno, sub, []) if sub in known else (node.lineno, module, [a.name]))
    return out


def test_every_arrow_points_down() -> None:
    known = modules()
    upward = []
    for module, path in known.items():
        for line, target, _ in imports(path, known):
            if layer(target) > layer(module):
                upward.append(f"{path.relative_to(ROOT)}:{line}: {module} -> {target}")
    assert upward == []


def test_no_circle_between_modules() -> None:
    known = modules()
    graph = {m: {t for _, t, _ in imports(p, known) if t in known and t != m} for m, p in known.items()}
    # a package's __init__ that re-exports its modules is not a circle with them
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert cycles == []


def test_no_private_name_crosses_a_file() -> None:
    known = modules()
    crossing = []
    for path in known.values():
        for line, target, names in imports(path, known):
            crossing += [f"{path.relative_to(ROOT)}:{line}: {target}.{n}" for n in names
                         if n.startswith("_") and not n.startswith("__")]
            if target.rsplit(".", 1)[-1].startswith("_") and not target.endswith("__main__"):
                crossing.append(f"{path.relative_to(ROOT)}:{line}: {target}")
    assert crossing == []


def test_every_click_model_fits_with_one_signature() -> None:
    import inspect

    from ubi_pipeline.processors.click_models.registry import MODEL_NAMES, get_model

    for name in MODEL_NAMES:
        model = get_model(name)
        assert list(inspect.signature(model.fit).parameters) == ["sessions", "systems"], name
        assert isinstance(model.uses_systems, bool), name
