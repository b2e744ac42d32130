"""Reading YAML files and `key=value` overrides: the one YAML reader (of train configs and sweep
files), the one `extends:` walker and the one conversion of YAML overrides to a dotlist.

Knows no schema (orchestrator.core.config builds on it): pure, imports no Ray, DeepSpeed or MLflow.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from orchestrator.core.errors import ConfigError

# Resolvers a config may use. OmegaConf ships `oc.env`, `oc.select`, ... ; we register no
# `eval` (or any code-running) resolver, and reject any resolver outside this list.
ALLOWED_RESOLVERS = ("oc.env", "oc.select", "oc.decode", "oc.create", "oc.dict.keys", "oc.dict.values")
_RESOLVER_RE = re.compile(r"\$\{([\w.]+):")
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""yaml.safe_load's loader, in C where PyYAML has libyaml: ten times faster on a long file (a
ramp of 10,000 steps)."""
MAX_BYTES = 16 * 2**20
"""The largest YAML text read (a ramp of 10,000 steps is about 400 KB)."""
MAX_NODES = 2_000_000
"""The most nodes a YAML document may hold once its aliases are expanded: an alias shares a node
when loaded, but whatever copies the result (OmegaConf, a deepcopy) expands it, so a few hundred
bytes of aliases nested nine deep would become hundreds of millions of nodes."""


def load_text(text: str) -> Any:
    """The one YAML load: safe, bounded in size and in expanded nodes (yaml.YAMLError beyond)."""
    if len(text) > MAX_BYTES:
        raise yaml.YAMLError(f"{len(text):,} characters, more than the {MAX_BYTES:,} a YAML file may hold here")
    loader = SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded = _expanded_nodes(node, {})
        if expanded > MAX_NODES:
            raise yaml.YAMLError(
                f"its aliases expand to {expanded:,} nodes, more than {MAX_NODES:,}: write the values out"
            )
        return loader.construct_document(node)
    except RecursionError:
        raise yaml.YAMLError("nested too deep") from None
    finally:
        loader.dispose()


def _expanded_nodes(node: yaml.Node, seen: Dict[int, int]) -> int:
    """How many nodes `node` stands for with every alias written out (a shared node counted each
    time it is reached, each computed once)."""
    if id(node) not in seen:
        seen[id(node)] = 0  # an alias cycle counts its way round once
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        seen[id(node)] = 1 + sum(_expanded_nodes(child, seen) for child in children)
    return seen[id(node)]


def read_mapping(
    path: Path, what: str = "CONFIG", kind: str = "config", shape: str = "a mapping of config sections"
) -> Tuple[Dict[str, Any], str]:
    """(mapping, text) of one YAML file; a missing file, a syntax error or a non-mapping is a
    one-line ConfigError keyed `what`. The one YAML reader of train configs and sweep files."""
    if not path.is_file():
        raise ConfigError(what, f"{kind} file {str(path)!r} not found")
    text = path.read_text()
    return parse_mapping(text, path, what, shape), text


def parse_mapping(
    text: str, path: Path, what: str = "CONFIG", shape: str = "a mapping of config sections"
) -> Dict[str, Any]:
    """The mapping of one YAML text that `path` names (a file, or an MLflow run's copy of one)."""
    try:
        raw = load_text(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(what, f"YAML syntax error in {path}{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(what, f"{path} must hold {shape}, got {type(raw).__name__}")
    return raw


def extends_chain(path: Path) -> List[Tuple[Path, Dict[str, Any], str]]:
    """The one `extends:` walker: [(path, mapping without `extends`, text)] of a train config and
    the files it builds on (each relative to the file naming it), nearest first. Checks each
    file's resolvers against the allow-list and refuses a cycle."""
    chain: List[Tuple[Path, Dict[str, Any], str]] = []
    while True:
        if path.is_file() and path.resolve() in [p.resolve() for p, _, _ in chain]:
            seen = ", ".join(str(p) for p, _, _ in reversed(chain))
            raise ConfigError("extends", f"{path} extends itself (cycle through {seen})")
        raw, text = read_mapping(path)
        for match in _RESOLVER_RE.finditer(text):
            if match.group(1) not in ALLOWED_RESOLVERS:
                raise ConfigError(
                    "CONFIG", f"{path} uses resolver ${{{match.group(1)}:...}}; allowed: {', '.join(ALLOWED_RESOLVERS)}"
                )
        parent = raw.pop("extends", None)
        chain.append((path, raw, text))
        if parent is None:
            return chain
        path = path.parent / str(parent)


def dotlist(overrides: Any, what: str = "base.overrides") -> List[str]:
    """The one conversion of overrides written in a YAML file to `key=value` strings: a mapping
    {optim.lr: 3.0e-4, data.sources: [...]} (lists and dicts as YAML flow text) or a list of them."""
    if isinstance(overrides, dict):
        return [f"{k}={dotlist_value(v)}" for k, v in overrides.items()]
    if isinstance(overrides, (list, tuple)):
        return [str(o) for o in overrides]
    raise ConfigError(what, f"got {overrides!r}; valid: a mapping of key: value or a list of key=value")


def dotlist_value(value: Any) -> str:
    """One value as the text after `key=` (parsed back as YAML by parse_overrides)."""
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    return "null" if value is None else str(value)


def parse_overrides(overrides: List[str]) -> List[tuple]:
    """key=value strings -> [(key, value)], values parsed as YAML like OmegaConf's dotlist."""
    parsed = []
    for item in overrides:
        key, value = _parse_override(item)
        parsed.append((key, copy.deepcopy(value) if isinstance(value, (list, dict)) else value))
    return parsed


@functools.lru_cache(maxsize=4096)
def _parse_override(item: str) -> tuple:
    """One key=value, parsed once per process: a sweep's trials repeat the same few (the values
    of its grid), and OmegaConf's parser costs about a millisecond each. Its lists and dicts are
    shared: parse_overrides hands out copies."""
    key, sep, _ = item.partition("=")
    if not sep or not key:
        raise ConfigError(item, "an override must look like key=value (e.g. optim.lr=3e-4)")
    match = _RESOLVER_RE.search(item)
    if match and match.group(1) not in ALLOWED_RESOLVERS:
        raise ConfigError(
            key, f"resolver ${{{match.group(1)}:...}} not allowed; allowed: {', '.join(ALLOWED_RESOLVERS)}"
        )
    try:
        # resolve=False keeps `${oc.env:...}` as written, so it can be redacted later.
        value = OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=False)
    except (OmegaConfBaseException, yaml.YAMLError) as exc:  # YAML: e.g. over OmegaConf's 10,000 nodes
        raise ConfigError(key, str(exc).splitlines()[0]) from None
    for part in key.split("."):
        value = value[part]
    return key, value
