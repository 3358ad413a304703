"""User-facing errors: the CLI prints them as one line and exits non-zero, with no traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """An error caused by the user's input (a file, a config, a flag), not by a bug."""


class ConfigError(UserError):
    """A bad config key or value; ``key`` is the full dotted key."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"config key '{key}': {message}" if key else message)

    def under(self, prefix: str) -> ConfigError:
        """The same error with ``prefix`` put in front of its key."""
        return ConfigError(f"{prefix}.{self.key}" if self.key else prefix, self.message)


class DataError(UserError):
    """A bad record in a data file: names the file, the line (1-based) and the field."""

    def __init__(self, path: str, line: int | None, message: str, field: str | None = None):
        self.path = str(path)
        self.line = line
        self.field = field
        self.reason = message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f" field '{field}':" if field else ""
        super().__init__(f"{where}:{what} {message}")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
