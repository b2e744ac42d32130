"""The project's own import graph (orchestrator/ and workloads/), read from the source with ast:
every import, at module level or inside a function (a function-level import that closes a
circle is still a circle, only a later one), except those under `if TYPE_CHECKING:`.

No circle: a module's imports, followed any number of steps, never lead back to it. The layers
(docs/design.md 2) are the folders: each room imports only the rooms of MAY_IMPORT (the formulas
no other room, the core only the formulas, workloads the core and the tracking door, reporting
never the driver); the pure rooms
name no Ray, DeepSpeed, MLflow or torch anywhere, and import with those four blocked. One door to
MLflow: outside orchestrator/tracking/ no module (benchmarks/ included) imports mlflow or reads the
fields of MLflow's own run objects; the door hands out the project's records instead."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest

from tests.conftest import ROOT

PACKAGES = ("orchestrator", "workloads")
HEAVY = ("ray", "deepspeed", "mlflow", "torch")
DOOR = Path("orchestrator") / "tracking"
"""The one room that talks to MLflow (docs/design.md 2)."""
BEHIND_THE_DOOR = (*PACKAGES, "benchmarks")
"""Where the rest of the code lives: it reaches MLflow only through the door (tracking/store.py)."""
MLFLOW_FIELDS = {
    "info": {
        "run_id",
        "run_uuid",
        "run_name",
        "status",
        "start_time",
        "end_time",
        "experiment_id",
        "artifact_uri",
        "lifecycle_stage",
        "user_id",
    },
    "data": {"tags", "params", "metrics"},
}
"""The fields of MLflow's run objects (`Run.info.*`, `Run.data.*`), which only the door reads: it
hands out tracking.records.RunRecord. The config's `cfg.data.*` has none of these names, and a
Ray job's `info.status` is not read through an `.info` attribute."""


FORMULAS = ("orchestrator.formulas",)
"""Pure and the lowest floor: the arithmetic on plain numbers, one place per formula, with an error
of its own (formulas/errors.py, which the core re-exports); it imports no other room."""
CORE = ("orchestrator.core", *FORMULAS)
"""Pure: the config (schema, loading, validation, what it implies, the sweep file, what core needs
of the workloads by import path) and the formulas below it."""
ANALYSIS = ("orchestrator.analysis",)
"""Pure: runs as records, the critical batch size, the branch measurement."""
PURE = CORE + ANALYSIS
TRACKING = ("orchestrator.tracking",)
REPORTING = ("orchestrator.reporting", "orchestrator.export")
STUDIES = ("orchestrator.studies",)
WORKLOADS = ("workloads",)

MAY_IMPORT = {  # room -> the rooms it may import besides itself (docs/design.md 2)
    "orchestrator.formulas": (),
    "orchestrator.core": FORMULAS,
    "orchestrator.analysis": PURE,
    "orchestrator.tracking": CORE,
    "workloads": CORE + TRACKING,
    "orchestrator.reporting": PURE + TRACKING,
    "orchestrator.export": CORE + TRACKING + WORKLOADS,  # the checkpoint's one reader
    "orchestrator.studies": PURE + TRACKING + REPORTING,
    "orchestrator.driver": PURE + TRACKING + REPORTING + STUDIES + WORKLOADS,
    "orchestrator.cluster": CORE + TRACKING + STUDIES,
}
"""The entry points (orchestrator.cli, __main__, the public re-exports) may import any room."""


def room(module: str) -> str:
    """orchestrator.core.schema -> orchestrator.core; any workloads module -> workloads;
    orchestrator.cli (a top-level entry point) -> orchestrator."""
    parts = module.split(".")
    if parts[0] == "workloads":
        return "workloads"
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def layer_violations(graph: Dict[str, Set[str]]) -> List[str]:
    """'a -> b' for every import that breaks the layers."""
    bad = []
    for m, out in graph.items():
        if room(m) not in MAY_IMPORT:
            continue
        allowed = {room(m), *MAY_IMPORT[room(m)]}
        bad += [f"{m} -> {x}" for x in sorted(out) if room(x) not in allowed]
    return sorted(bad)


def pure_modules(graph: Dict[str, Set[str]]) -> List[str]:
    return sorted(m for m in graph if room(m) in PURE)


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


def test_the_layers_hold():
    graph = import_graph(ROOT)
    rooms = {room(m) for m in graph}
    assert rooms == set(MAY_IMPORT) | {"orchestrator"}, "every room is in the table, every room in the table exists"
    assert layer_violations(graph) == []


def test_a_planted_upward_import_is_a_violation():
    graph = import_graph(ROOT)
    graph["orchestrator.formulas.batching"] = graph["orchestrator.formulas.batching"] | {"orchestrator.driver.launch"}
    graph["orchestrator.formulas.memory"] = graph["orchestrator.formulas.memory"] | {"orchestrator.core.errors"}
    graph["orchestrator.reporting.plots"] = graph["orchestrator.reporting.plots"] | {"orchestrator.driver.sweep"}
    graph["workloads.train.engine"] = graph["workloads.train.engine"] | {"orchestrator.analysis.trials"}
    assert layer_violations(graph) == [
        "orchestrator.formulas.batching -> orchestrator.driver.launch",
        "orchestrator.formulas.memory -> orchestrator.core.errors",
        "orchestrator.reporting.plots -> orchestrator.driver.sweep",
        "workloads.train.engine -> orchestrator.analysis.trials",
    ]


@pytest.mark.parametrize("module", pure_modules(import_graph(ROOT)))
def test_the_pure_layers_name_no_heavy_library(module):
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    named = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    named |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in named if m.split(".")[0] in HEAVY}, "an import of Ray, DeepSpeed, MLflow or torch"


def test_the_pure_layers_import_with_ray_deepspeed_mlflow_and_torch_blocked():
    blocker = (
        "import importlib, sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {HEAVY!r}: raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for m in {pure_modules(import_graph(ROOT))!r}: importlib.import_module(m)\n"
        f"assert not [m for m in sys.modules if m.split('.')[0] in {HEAVY!r}]\n"
    )
    subprocess.run([sys.executable, "-c", blocker], cwd=ROOT, check=True)


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


def mlflow_uses(source: str) -> List[str]:
    """'line: what' for each import of mlflow and each read of an MLflow run object's fields
    (`x.info.run_id`, `x.data.tags`, ...) in a module's source, in line order; strings and
    comments are not code."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] == "mlflow"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "mlflow":
            found.append((node.lineno, f"from {node.module} import"))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            if node.attr in MLFLOW_FIELDS.get(node.value.attr, ()):
                found.append((node.lineno, f".{node.value.attr}.{node.attr}"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_only_the_tracking_door_talks_to_mlflow():
    files = [p for folder in BEHIND_THE_DOOR for p in sorted((ROOT / folder).rglob("*.py"))]
    outside = [p for p in files if not p.relative_to(ROOT).is_relative_to(DOOR)]
    assert len(outside) > 100 and any(p.parent.name == "benchmarks" for p in outside), "the check reads the project"
    found = {str(p.relative_to(ROOT)): mlflow_uses(p.read_text()) for p in outside}
    assert {path: uses for path, uses in found.items() if uses} == {}


def test_a_planted_mlflow_read_outside_the_door_is_found():
    source = '''
import mlflow
from mlflow.tracking import MlflowClient
from ray.air.integrations import mlflow as ray_mlflow  # Ray's callback: no MLflow object is read here

def trial(run, cfg, info, client):
    """run.data.tags in a docstring is not code"""
    seq, status = cfg.data.seq_len, info.status  # the config's own data section; a Ray job's info
    return run.data.tags.get("x"), client.get_run(run).info.run_id, run.data.metrics
'''
    assert mlflow_uses(source) == [
        "2: import mlflow",
        "3: from mlflow.tracking import",
        "9: .data.metrics",
        "9: .data.tags",
        "9: .info.run_id",
    ]
