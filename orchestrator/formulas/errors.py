"""The error of the formulas' floor: a value the arithmetic cannot take, named by its key.

The formulas take plain numbers, and the caller names the key each number came from (a config key
such as "batch.tokens_per_update", or a flag such as "--device-memory"), so the error can say
which input was wrong, what it got and what would be valid.

One class, defined here on the lowest floor and re-exported by `orchestrator.core.errors` under
the same name, is the project's one error of bad configuration or arguments: the CLI maps it to
exit code 2 and one line on stderr. Why one class rather than two:

- a `ConfigError` in core subclassing an error of this floor would not catch what the formulas
  raise (`except ConfigError` misses an instance of its base), so every caller of a formula in
  every room would have to catch and convert, and one that forgot would escape the CLI's exit 2;
- the class's name is printed (a failed run's reason, "ConfigError: batch.ramp.1...", and a sweep
  that failed), so a second name would change what users read.

Defined once, `orchestrator.formulas.errors.ConfigError is orchestrator.core.errors.ConfigError`:
raising, catching, the message and pickling (a worker's error reaches the driver whole) behave as
before, and no import runs from the formulas up to the core.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad configuration or bad arguments: exit code 2, one line on stderr, no traceback.

    The message names the key, the value and what would be valid.
    """

    def __init__(self, key: str, message: str):
        self.key, self.message = key, message
        super().__init__(f"{key}: {message}" if key else message)

    def __reduce__(self):  # raised on a Ray worker, it reaches the driver whole
        return (type(self), (self.key, self.message))
