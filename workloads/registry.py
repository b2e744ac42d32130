"""The public path of the workload registry (orchestrator/registry.py): `from workloads import
registry`, then `@registry.register("name")` on a workload factory."""

from orchestrator.registry import BUILTIN, factory, importable, is_import_path, names, register, register_all  # noqa: F401
