"""The public path of the Python API (orchestrator/reporting/results.py): `load_sweep` and the
tables it returns (docs/design.md 3)."""

from orchestrator.reporting.results import Fit, SweepResults, load_sweep  # noqa: F401
