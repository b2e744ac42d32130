"""The public path of the Python API (orchestrator/reporting/sweep_tables.py): `load_sweep` and the
tables it returns (docs/design.md 3)."""

from orchestrator.reporting.sweep_tables import Fit, SweepResults, load_sweep  # noqa: F401
