"""One exception hierarchy for the whole project.

Third-party errors (yaml, sqlite, grpc, aiomqtt, pynvml, icmplib) are translated into these at the
boundary where they occur, so commands print ``str(error)`` (a one-line message naming the file,
the field and what was expected) and never a traceback.
"""

from __future__ import annotations


class HulkError(Exception):
    """Base of every error a user may see. ``str()`` is the one-line message."""

    exit_code = 1


class InputError(HulkError):
    """Bad user input: a file, a field, a flag. Commands exit with code 2."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        where = ""
        if path:
            where = f"{path}:{line}: " if line else f"{path}: "
        if field:
            where += f"{field}: "
        super().__init__(where + message)
        self.path, self.line, self.field = path, line, field


class ConfigError(InputError):
    """An invalid setting (config file, HULK_* variable, flag)."""


class PlanningError(HulkError):
    """A plan cannot be made: impossible memory, empty or split fleet. Exit code 2."""

    exit_code = 2


class NotFoundError(HulkError):
    """A named thing (node, model, checkpoint) does not exist."""


class PermissionDeniedError(HulkError):
    """The caller is known but may not do this (e.g. reports as another node)."""


class UnauthenticatedError(HulkError):
    """The caller presented no valid credential."""


class RateLimitedError(HulkError):
    """The caller exceeded its rate limit."""


class UnavailableError(HulkError):
    """A service (planner, broker) cannot be reached right now; retry later."""


class StoreError(HulkError):
    """The SQLite store failed (disk full, locked past the timeout, corrupt)."""
