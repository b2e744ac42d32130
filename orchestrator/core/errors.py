"""Errors the command line maps to exit codes (docs/design.md 3).

`ConfigError` is defined on the formulas' floor (orchestrator/formulas/errors.py says why) and is
the same class here: the core and every room above it raise and catch it by this path, and the
formulas raise it without importing anything from the core.
"""

from orchestrator.formulas.errors import ConfigError

__all__ = ["ConfigError"]
