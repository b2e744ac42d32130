"""The public path of the workload registry (orchestrator/core/registry.py): `from workloads import
registry`, then `@registry.register("name")` on a workload factory."""

from orchestrator.core.registry import BUILTIN, factory, importable, is_import_path, names, register, register_all  # noqa: F401
