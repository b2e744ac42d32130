"""What the core needs of the workloads, held by import path so that it imports none of them:
workloads by name (the one table that both building, workloads/workload.py, and config
validation, `model.name` in orchestrator/core/validation.py, read), the config check of a workload
that needs its own library (`hf`: transformers reads the model's config), and the tokenizer's
vocabulary size (`model.vocab_size` follows `data.tokenizer`). Public as `workloads.registry`.

A name maps to a factory `(cfg, plan, device) -> Workload` (the protocol of workload.py),
held as an import path "package.module:attribute" and imported only when a workload is built,
so this module needs nothing beyond the standard library: the config schema can ask for the
names without importing torch.

    @registry.register("bigram")           # or register("bigram", "my_pkg.bigram:Bigram")
    class Bigram: ...                      # anything that satisfies workload.Workload

Training runs in other processes (Ray workers), which do not see this process's table: the
driver sends `importable()` with the run's config and the worker `register_all`s it. A
factory defined in `__main__` or inside a function cannot be imported elsewhere and works only
in this process.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Optional, Tuple, Union

BUILTIN = ("gpt", "linreg", "hf")
"""Registered below, by import path; known to every process without being sent."""

_entries: Dict[str, Union[str, Callable[..., Any]]] = {}


def _import_path(obj: Any) -> Optional[str]:
    """'module:qualname' of obj when another process can import it, else None."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname:
        return None
    return f"{module}:{qualname}"


def register(name: str, factory: Union[str, Callable[..., Any], None] = None):
    """Register `factory` (a callable or a "module:attr" path) under `name`; without a factory,
    a decorator. Registering a name again with a different factory is an error."""
    if factory is None:

        def decorator(f: Callable[..., Any]) -> Callable[..., Any]:
            register(name, f)
            return f

        return decorator
    if not name or "," in name or "=" in name:
        raise ValueError(f"workload name {name!r}: must be non-empty, without ',' or '='")
    if isinstance(factory, str) and ":" not in factory:
        raise ValueError(f"workload {name!r}: {factory!r} is not an import path 'package.module:attribute'")
    path = factory if isinstance(factory, str) else _import_path(factory)
    known = _entries.get(name)
    if known is not None and known is not factory and (path is None or _target(known) != path):
        raise ValueError(f"workload {name!r} is already registered as {_target(known)}")
    _entries.setdefault(name, factory)
    return factory


def importable() -> Dict[str, str]:
    """{name: "module:attr"} of the registered workloads another process can import."""
    paths = {name: entry if isinstance(entry, str) else _import_path(entry) for name, entry in _entries.items()}
    return {name: path for name, path in paths.items() if path and name not in BUILTIN}


def register_all(paths: Dict[str, str]) -> None:
    """Register what another process's `importable()` listed (a Ray worker, from its driver)."""
    for name, path in paths.items():
        register(name, path)


def _target(entry: Union[str, Callable[..., Any]]) -> str:
    return entry if isinstance(entry, str) else (_import_path(entry) or repr(entry))


def names() -> Tuple[str, ...]:
    """Every registered name: the built-in ones first, then the others in registration order."""
    return tuple(_entries)


def is_import_path(name: str) -> bool:
    """`package.module:factory`: a workload named by where it lives, not registered."""
    module, _, attr = name.partition(":")
    return bool(module and attr) and all(part.isidentifier() for part in (*module.split("."), *attr.split(".")))


def factory(name: str) -> Callable[..., Any]:
    """The factory registered under `name` (or at import path `name`), imported on first use.
    KeyError for an unknown name; ImportError or AttributeError for a path that does not import."""
    entry = _entries.get(name)
    if entry is None and is_import_path(name):
        entry = name
    if entry is None:
        raise KeyError(f"unknown workload {name!r}; registered: {', '.join(names())}")
    if isinstance(entry, str):
        entry = load(entry)
        if name in _entries:
            _entries[name] = entry
    return entry


def load(path: str) -> Any:
    """The object at "package.module:attribute", imported now: a workload's factory or check, or
    anything else the config names by import path (a tracking sink, `tracking.sinks`)."""
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def compute_params(cfg: Any) -> Optional[int]:
    """model.params of a config, the N of a ladder's laws (formulas/memory.ModelCosts.compute_params),
    from the workload's costs(cfg) without building its model; None when it states no costs."""
    costs = getattr(factory(cfg.model.name), "costs", None)
    found = costs(cfg) if costs else None
    return int(found.compute_params) if found and found.compute_params else None


CONFIG_CHECKS = {"hf": "workloads.builtin.hf_model:hf_config"}
"""model.name -> the check (cfg -> None, raises ConfigError) validation runs for it."""
TOKENIZER_LOAD = "workloads.text.tokenizer:load"


def check(cfg: Any) -> None:
    """The config check of cfg.model.name's workload, if it has one (imported only then)."""
    if cfg.model.name in CONFIG_CHECKS:
        load(CONFIG_CHECKS[cfg.model.name])(cfg)


def vocab_size(tokenizer: str) -> int:
    """Tokens of the tokenizer named by data.tokenizer (the tokenizers are torch-free)."""
    return load(TOKENIZER_LOAD)(tokenizer).vocab_size


register("gpt", "workloads.workload:GPTWorkload")  # decoder-only transformer over packed documents
register("linreg", "workloads.workload:LinRegWorkload")  # noise scale known in closed form
register("hf", "workloads.builtin.hf_model:HFWorkload")  # a transformers causal LM (the hf extra)
