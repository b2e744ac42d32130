"""The shape of the code, read statically (no import, nothing run): figures for issue 34's
closing note, reproducible on any checkout.

    python benchmarks/code_shape.py [ROOT] [--longest 10] [--json]

ROOT (default: this checkout) holds `orchestrator/` and `workloads/`. Printed:

- `Dict[str, Any]`: how many times the text occurs in ROOT's .py files, and on how many lines
  (the same count as `grep -rn "Dict\\[str, Any\\]" orchestrator workloads | wc -l`, which counts
  lines).
- The longest functions: lines from `def` to the function's last line (decorators excluded).
- A sweep's path, from `orchestrator.driver.sweep.run` to the worker's entry
  `workloads.train.train_loop.train_worker`. Method: every module of ROOT is parsed with ast; each
  function and method is a node `module.function` / `module.Class.method`. An edge goes from a
  function to every function its body names (called or passed on, as `tune.with_parameters(f)`
  or `TorchTrainer(f)` pass theirs), the name resolved through the module's imports (module-level
  and function-level alike), its own top-level definitions, `self.method` in a class, and
  `module.attribute` / `Class.method` attributes; naming a class reaches its `__init__` and
  `__post_init__`. Calls on an instance (`store.get_run(...)`) are not resolved: the type of a
  value is not known statically. The spine is every function on some chain of edges from the start
  to the end (reachable from the start and reaching the end); the path is the spine with every
  call a spine function makes (the end's own excluded). Printed: the spine, and for the path its
  calls, functions, files, rooms (the top-level folders under orchestrator/, plus workloads),
  the calls that change room, and of those the climbs: an edge into a room that a lower-layered room
  may not import (docs/design.md 2's layers, lowest first: core and formulas, analysis, tracking,
  workloads, reporting and export, studies, driver, cluster, the entry points).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import defaultdict, deque
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple

PACKAGES = ("orchestrator", "workloads")
START = "orchestrator.driver.sweep.run"
END = "workloads.train.train_loop.train_worker"
LAYER = {  # docs/design.md 2: a room imports only rooms of a lower layer (or its own)
    "core": 0,
    "formulas": 0,
    "analysis": 1,
    "tracking": 2,
    "workloads": 3,
    "reporting": 4,
    "export": 4,
    "studies": 5,
    "driver": 6,
    "cluster": 7,
    "(entry)": 8,
}


def modules(root: Path) -> Dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def room(function: str) -> str:
    parts = function.split(".")
    if parts[0] == "workloads":
        return "workloads"
    return parts[1] if parts[1] in LAYER else "(entry)"


def dict_str_any(root: Path) -> Tuple[int, int]:
    """(occurrences, lines) of `Dict[str, Any]` in the packages' .py files."""
    pattern, count, lines = re.compile(r"Dict\[str, Any\]"), 0, 0
    for path in modules(root).values():
        for line in path.read_text().splitlines():
            hits = len(pattern.findall(line))
            count, lines = count + hits, lines + (hits > 0)
    return count, lines


def longest_functions(root: Path, n: int) -> List[Tuple[int, str]]:
    """(lines, 'file:line name') of the n longest functions and methods."""
    sizes = []
    for path in modules(root).values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"{path.relative_to(root)}:{node.lineno} {node.name}"
                sizes.append((node.end_lineno - node.lineno + 1, where))
    return sorted(sizes, key=lambda s: (-s[0], s[1]))[:n]


class _Module:
    """One module's definitions and the names its imports bind."""

    def __init__(self, name: str, tree: ast.Module, is_package: bool) -> None:
        self.name, self.tree = name, tree
        self.functions: Dict[str, ast.AST] = {}  # 'f' or 'Class.method' -> node
        self.classes: Set[str] = set()
        self.bindings: Dict[str, str] = {}  # local name -> dotted target (a module or module.attribute)
        package = name if is_package else name.rpartition(".")[0]
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes.add(node.name)
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.functions[f"{node.name}.{item.name}"] = item
        for node in ast.walk(tree):  # function-level imports bind names too
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.bindings[alias.asname] = alias.name
                    else:
                        self.bindings[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                for alias in node.names:
                    self.bindings[alias.asname or alias.name] = f"{base}.{alias.name}"


def call_graph(root: Path) -> Dict[str, List[str]]:
    """Function -> the functions its body names, in the order of the source (the method of the
    module docstring)."""
    parsed = {
        name: _Module(name, ast.parse(path.read_text()), path.name == "__init__.py")
        for name, path in modules(root).items()
    }

    def target(dotted: str) -> List[str]:
        """A dotted name -> the function nodes it is (a function, a class's constructors)."""
        module, _, attr = dotted.rpartition(".")
        for cut in (module, dotted.rpartition(".")[0].rpartition(".")[0]):
            if cut in parsed:
                rest = dotted[len(cut) + 1 :]
                m = parsed[cut]
                if rest in m.functions:
                    return [f"{cut}.{rest}"]
                if rest in m.classes:
                    return [f"{cut}.{rest}.{k}" for k in ("__init__", "__post_init__") if f"{rest}.{k}" in m.functions]
                if rest in m.bindings:  # a re-export
                    return target(m.bindings[rest])
        return []

    def dotted_of(node: ast.AST, m: _Module) -> Optional[str]:
        if isinstance(node, ast.Name):
            if node.id in m.functions or node.id in m.classes:
                return f"{m.name}.{node.id}"
            return m.bindings.get(node.id)
        if isinstance(node, ast.Attribute):
            inner = dotted_of(node.value, m)
            return f"{inner}.{node.attr}" if inner else None
        return None

    graph: Dict[str, List[str]] = {}
    for m in parsed.values():
        for qualified, fn in m.functions.items():
            me = f"{m.name}.{qualified}"
            owner = qualified.rpartition(".")[0]
            named: List[Tuple[int, int, str]] = []  # (line, column, function): in the order of the source
            for node in ast.walk(fn):
                where = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and owner:
                    if node.value.id in ("self", "cls") and f"{owner}.{node.attr}" in m.functions:
                        named.append((*where, f"{m.name}.{owner}.{node.attr}"))
                        continue
                if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
                    dotted = dotted_of(node, m)
                    if dotted:
                        named += [(*where, t) for t in target(dotted) if t != me]
            graph[me] = list(dict.fromkeys(t for *_, t in sorted(named)))
    return graph


def reachable(graph: Mapping[str, Iterable[str]], start: str) -> Set[str]:
    seen, todo = {start}, deque([start])
    while todo:
        for nxt in graph.get(todo.popleft(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def reading_walk(graph: Mapping[str, List[str]], start: str, end: str) -> List[str]:
    """The functions a reader visits from `start` until `end` is first called: depth first, each
    function's calls in the order of its source, a function read once; each step down into a
    callee and each return up to its caller is one move (a list of the functions the reader is
    in, one per move)."""
    moves: List[str] = [start]
    seen = {start}

    def read(function: str) -> bool:
        for callee in graph.get(function, ()):
            if callee == end:
                moves.append(end)
                return True
            if callee in seen:
                continue
            seen.add(callee)
            moves.append(callee)
            if read(callee):
                return True
            moves.append(function)  # back in the caller
        return False

    read(start)
    return moves


def sweep_path(root: Path) -> Dict[str, object]:
    graph = call_graph(root)
    reverse: Dict[str, Set[str]] = defaultdict(set)
    for a, bs in graph.items():
        for b in bs:
            reverse[b].add(a)
    spine = reachable(graph, START) & reachable(reverse, END)
    # What a reader follows: every call a function of the spine makes (the worker's own code excluded).
    edges = sorted((a, b) for a in spine - {END} for b in graph.get(a, ()))
    touched = spine | {b for _, b in edges}
    crossings = [(a, b) for a, b in edges if room(a) != room(b)]
    climbs = [(a, b) for a, b in crossings if LAYER[room(b)] > LAYER[room(a)]]
    known = modules(root)
    walk = reading_walk(graph, START, END)
    changes = [(a, b) for a, b in zip(walk, walk[1:]) if room(a) != room(b)]
    return {
        "walk_functions": len(set(walk)),
        "walk_calls": len(set(walk)) - 1,  # each function but the first was entered by one call
        "walk_files": len({_module_of(f, known) for f in walk}),
        "walk_rooms": sorted({room(f) for f in walk}),
        "walk_room_changes": len(changes),
        "walk_climbs": sum(LAYER[room(b)] > LAYER[room(a)] for a, b in changes),
        "spine": sorted(spine),
        "calls": len(edges),
        "functions": len(touched),
        "files": len({_module_of(f, known) for f in touched}),
        "rooms": sorted({room(f) for f in touched}),
        "room_changes": len(crossings),
        "climbs": len(climbs),
        "edges": [f"{a} -> {b}" for a, b in edges],
    }


def _module_of(function: str, known: Dict[str, Path]) -> str:
    """The module a function node belongs to (its longest prefix that is a module)."""
    parts = function.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:cut]) in known:
            return ".".join(parts[:cut])
    return function


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--longest", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    parser.add_argument("--edges", action="store_true", help="list the path's calls")
    args = parser.parse_args(argv)
    root = Path(args.root)
    count, lines = dict_str_any(root)
    longest = longest_functions(root, args.longest)
    path = sweep_path(root)
    if args.json:
        print(json.dumps({"dict_str_any": count, "dict_str_any_lines": lines, "longest": longest, "path": path}))
        return 0
    print(f"Dict[str, Any]: {count} annotations on {lines} lines")
    print(f"the {args.longest} longest functions (lines):")
    for size, where in longest:
        print(f"  {size:4d}  {where}")
    print(f"a sweep's path {START} -> {END}:")
    print(f"  the spine ({len(path['spine'])} functions):")
    for function in path["spine"]:
        print(f"    {room(function):10s} {function}")
    print(
        f"  with every call the spine makes: {path['calls']} calls to {path['functions']} functions in "
        f"{path['files']} files and {len(path['rooms'])} rooms ({', '.join(path['rooms'])}), "
        f"{path['room_changes']} changes of room, {path['climbs']} of them climbs"
    )
    print(
        f"  read depth first in source order until the worker's entry: {path['walk_calls']} calls, "
        f"{path['walk_functions']} functions in {path['walk_files']} files and {len(path['walk_rooms'])} rooms "
        f"({', '.join(path['walk_rooms'])}), {path['walk_room_changes']} changes of room, "
        f"{path['walk_climbs']} of them climbs back up"
    )
    if args.edges:
        for edge in path["edges"]:
            print(f"    {edge}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
