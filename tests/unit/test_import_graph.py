"""The project's own import graph (orchestrator/ and workloads/), read from the source with ast:
every import, at module level or inside a function (a function-level import that closes a
circle is still a circle, only a later one), except those under `if TYPE_CHECKING:`.

No circle: a module's imports, followed any number of steps, never lead back to it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

from tests.conftest import ROOT

PACKAGES = ("orchestrator", "workloads")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _under_type_checking(node: ast.AST, parents: Dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def import_graph(root: Path, packages=PACKAGES) -> Dict[str, Set[str]]:
    """{module: the project modules it imports}, for every .py file of `packages` under root."""
    files = {_module_name(root, p): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    graph: Dict[str, Set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: Set[str] = set()
        for node in ast.walk(tree):
            if _under_type_checking(node, parents):
                continue
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from . import x, from .y import z
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        graph[name] = {m for m in found if m in files and m != name and not files[m].name == "__init__.py"}
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_project_has_no_import_circle():
    graph = import_graph(ROOT)
    assert len(graph) > 60 and graph["orchestrator.cli"], "the graph reads the project"
    assert cycles(graph) == []


def test_a_planted_circle_is_found_even_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "orchestrator"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from orchestrator import b\n")
    (pkg / "b.py").write_text("def f():\n    from orchestrator.c import g\n")
    (pkg / "c.py").write_text("from . import a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from orchestrator import a\n")
    (pkg / "e.py").write_text("import orchestrator.d\n")
    graph = import_graph(tmp_path, ("orchestrator",))
    assert graph["orchestrator.e"] == {"orchestrator.d"} and graph["orchestrator.d"] == set()
    assert cycles(graph) == [["orchestrator.a", "orchestrator.b", "orchestrator.c"]]
