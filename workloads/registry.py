"""The public path of the workload registry (orchestrator/core/workload_paths.py): `from workloads import
registry`, then `@registry.register("name")` on a workload factory."""

from orchestrator.core.workload_paths import BUILTIN, factory, importable, is_import_path, names, register, register_all  # noqa: F401
