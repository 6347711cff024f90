"""Errors that end a run with one clear message (the CLI prints them without a traceback)."""


class HarnessError(Exception):
    """Base class: a user-facing problem with input, config or a trace."""


class ConfigError(HarnessError):
    """A config value is wrong. The message names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        msg = f"config field '{field}': {problem}"
        if fix:
            msg += f" — fix: {fix}"
        super().__init__(msg)


class TraceError(HarnessError):
    """A trace is malformed (bad op, cycle, unknown communicator, corrupt file)."""
