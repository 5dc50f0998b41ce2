"""The one error type for bad input: a config file, a CLI flag, a knob value or an impossible combination."""


class ConfigError(ValueError):
    """Bad input. The message is one line that names the field and the fix; the CLI exits 2 with it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message if field in message else f"{field}: {message}")
