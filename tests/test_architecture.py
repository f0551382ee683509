"""The package's shape, as ARCHITECTURE promises it: one direction of dependency, counted with
every import (those inside functions too), and no cycle — module by module, and layer by layer.

    cli → notebook → (batch, telemetry, mcp) → engine → (models, persistence, tools) → messages

The engine, the models, the stores, the tools and the data model import no Jupyter, widgets
or pandas, and nothing of the layers above them.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "we0nb"

#: what each part of the package may import of the others (its own part always)
MAY_IMPORT = {
    "messages": {"errors", "_private"},
    "errors": {"_private"},
    "tools": {"messages", "errors", "_private"},
    "models": {"messages", "tools", "errors", "_private"},
    "persistence": {"messages", "models", "errors", "_private"},
    "engine": {"messages", "tools", "models", "persistence", "errors", "_private"},
    "mcp": {"engine", "messages", "tools", "models", "errors", "_private"},
    "batch": {"engine", "messages", "tools", "models", "persistence", "errors", "_private"},
    "telemetry": {"engine", "batch", "messages", "tools", "models", "persistence", "errors", "_private"},
    "testing": {"models", "messages", "errors", "_private"},
    "notebook": {"engine", "batch", "mcp", "telemetry", "messages", "tools", "models", "persistence", "errors",
                 "testing", "_private"},
    "cli": {"engine", "batch", "mcp", "telemetry", "notebook", "messages", "tools", "models", "persistence",
            "errors", "testing", "_private", "root"},
    "root": set(),  # we0nb/__init__.py composes every layer
}
#: third-party packages the lower layers never import (a notebook's, or a data frame's)
JUPYTER = ("IPython", "ipykernel", "ipywidgets", "pandas", "pyarrow", "matplotlib", "tqdm", "jupyter_client")
LOWER = ("messages", "errors", "tools", "models", "persistence", "engine")


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts)
        mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every module of the package, and every top-level third-party package, ``name`` imports
    (inside functions too; not under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = name if is_pkg else name.rsplit(".", 1)[0]
            if node.level:
                parts = base.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                module = base + ("." + node.module if node.module else "")
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
        for t in targets:
            if not t.startswith("we0nb"):
                found.add(t.split(".")[0])
                continue
            while t not in mods and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in mods and t != name:
                found.add(t)
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    head = parts[1]
    return "_private" if head.startswith("_") else head


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


# Parsed when this module is collected, before any test runs: on Python 3.11.7 a test that ran
# earlier in the same process could leave CPython's AST recursion check off (a CPython bug, fixed
# in later 3.11 releases), and ``ast.parse`` then failed here with "SystemError: AST constructor
# recursion depth mismatch" (seen once in a full run, 2026-12-06).
GRAPH = _graph()


def test_no_import_cycle_counting_imports_inside_functions() -> None:
    graph = {m: {t for t in ts if t.startswith("we0nb")} for m, ts in GRAPH.items()}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles: {cycles}"


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = defaultdict(set)
    for module, targets in GRAPH.items():
        part = _part(module)
        if part in ("root", "_private") and module.count(".") <= 1:
            continue  # the composition root, and the package's private helpers
        allowed = MAY_IMPORT.get(part)
        assert allowed is not None, f"{module}: a part of the package the architecture does not name ({part})"
        for t in targets:
            if not t.startswith("we0nb"):
                if part in LOWER and t in JUPYTER:
                    wrong[module].add(t)
                continue
            tp = _part(t)
            if tp != part and tp not in allowed:
                wrong[module].add(t)
    assert not wrong, "imports against the layers: " + "; ".join(f"{m} → {sorted(t)}" for m, t in sorted(wrong.items()))
