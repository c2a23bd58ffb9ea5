"""One exception hierarchy for the whole project, and the one table from error to gRPC status.

Third-party errors (yaml, sqlite, grpc, aiomqtt, pynvml, icmplib) are translated into these at the
boundary where they occur, so commands print ``str(error)`` (a one-line message naming the file,
the field and what was expected) and never a traceback.

The tree (exit code of a command that fails with it; gRPC status the planner answers with)::

    HulkError                          exit 1   INTERNAL
    +-- InputError                     exit 2   INVALID_ARGUMENT
    |   +-- ConfigError                exit 2   INVALID_ARGUMENT
    |   +-- BatchTooLargeError         exit 2   INVALID_ARGUMENT
    +-- PlanningError                  exit 2   INTERNAL
    +-- NotFoundError                  exit 1   NOT_FOUND
    +-- PermissionDeniedError          exit 1   PERMISSION_DENIED
    +-- UnauthenticatedError           exit 1   UNAUTHENTICATED
    +-- RateLimitedError               exit 1   RESOURCE_EXHAUSTED
    +-- UnavailableError               exit 1   UNAVAILABLE
    +-- StoreError                     exit 1   UNAVAILABLE

The planner turns an error into a status with :func:`grpc_status` (servicer and interceptors
alike); the agent turns a status back into an error with :func:`from_grpc`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # grpc is imported only where a status is needed: `plan` never loads it
    import grpc


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


class BatchTooLargeError(InputError):
    """A Report with more samples than the planner accepts in one batch."""


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


# The one table from error class to gRPC status name. A class not listed takes its nearest
# listed ancestor's status; an exception outside the tree is a bug and answers INTERNAL.
GRPC_STATUS: dict[type[HulkError], str] = {
    HulkError: "INTERNAL",
    InputError: "INVALID_ARGUMENT",
    NotFoundError: "NOT_FOUND",
    PermissionDeniedError: "PERMISSION_DENIED",
    UnauthenticatedError: "UNAUTHENTICATED",
    RateLimitedError: "RESOURCE_EXHAUSTED",
    UnavailableError: "UNAVAILABLE",
    # The store failing is the planner's passing trouble: the caller retries later.
    StoreError: "UNAVAILABLE",
}

# Status name -> the error a client raises for it. Where several classes share a status the
# client cannot tell them apart and gets the general one (UNAVAILABLE -> UnavailableError); the
# transport's own statuses (deadline, cancel, abort) are all "try again later".
FROM_GRPC_STATUS: dict[str, type[HulkError]] = {
    "INVALID_ARGUMENT": InputError,
    "NOT_FOUND": NotFoundError,
    "FAILED_PRECONDITION": NotFoundError,   # e.g. "node not registered"
    "PERMISSION_DENIED": PermissionDeniedError,
    "UNAUTHENTICATED": UnauthenticatedError,
    "RESOURCE_EXHAUSTED": RateLimitedError,
    "UNAVAILABLE": UnavailableError,
    "DEADLINE_EXCEEDED": UnavailableError,
    "CANCELLED": UnavailableError,
    "ABORTED": UnavailableError,
}


def grpc_status(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status the planner answers ``exc`` with (INTERNAL for anything outside the tree)."""
    import grpc

    for kind in type(exc).__mro__:
        name = GRPC_STATUS.get(kind)
        if name is not None:
            return grpc.StatusCode[name]
    return grpc.StatusCode.INTERNAL


def from_grpc(code: grpc.StatusCode | None, message: str) -> HulkError:
    """The error a client raises for a call that ended with status ``code`` (HulkError when the
    status means nothing more specific, or is unknown)."""
    name = getattr(code, "name", None)
    return FROM_GRPC_STATUS.get(name or "", HulkError)(message)
