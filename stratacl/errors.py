"""Errors that end a run with one clear message (the CLI prints them without a traceback)."""


class HarnessError(Exception):
    """Base class: a user-facing problem with input, config or a trace."""


class ConfigError(HarnessError):
    """A config value is wrong. The message names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        # args keep the constructor's arguments so `type(e)(*e.args)` (simpy re-raising a process's
        # exception, pickling across joblib workers) rebuilds the same error
        super().__init__(field, problem, fix)
        self.field, self.problem, self.fix = field, problem, fix

    def __str__(self) -> str:
        msg = f"config field '{self.field}': {self.problem}"
        return f"{msg} — fix: {self.fix}" if self.fix else msg


class TraceError(HarnessError):
    """A trace is malformed (bad op, cycle, unknown communicator, corrupt file)."""
