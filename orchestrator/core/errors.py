"""Errors the command line maps to exit codes (docs/design.md 3)."""


class ConfigError(ValueError):
    """Bad configuration or bad arguments: exit code 2, one line on stderr, no traceback.

    The message names the key, the value and what would be valid.
    """

    def __init__(self, key: str, message: str):
        self.key, self.message = key, message
        super().__init__(f"{key}: {message}" if key else message)

    def __reduce__(self):  # raised on a Ray worker, it reaches the driver whole
        return (type(self), (self.key, self.message))
