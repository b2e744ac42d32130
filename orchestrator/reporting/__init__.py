"""Runs -> records -> analysis -> tables, plots and report files; the Python API
(orchestrator.results)."""
