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
    |   +-- CertificateError           exit 1   UNAVAILABLE
    |   +-- RequestTimeoutError        exit 1   DEADLINE_EXCEEDED
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


class RequestTimeoutError(UnavailableError):
    """A call's deadline passed: the caller's request did not arrive in time (the planner's
    guard), or the answer did not (the client's deadline). Retried like an outage."""


class CertificateError(UnavailableError):
    """The TLS peer's certificate did not verify (wrong or missing CA, a name the certificate
    does not hold). Retried like any outage; the agent ends after a few in a row (exit 2)."""


# What TLS stacks say when *this side* could not verify the peer's certificate: BoringSSL inside
# gRPC, gRPC's own hostname check, and OpenSSL under Python's ssl (aiomqtt). An outage (refused,
# reset, timed out) or the peer refusing *our* certificate reads otherwise.
CERTIFICATE_FAILURE_MARKERS = (
    "CERTIFICATE_VERIFY_FAILED",          # no CA / unknown issuer / expired / name mismatch (ssl)
    "certificate signature failure",      # a CA with the same name but another key (BoringSSL)
    "Hostname Verification Check failed", # the address is not among the certificate's names
)


def is_certificate_failure(message: str) -> bool:
    """Whether ``message`` (a gRPC status detail, an ssl/MQTT error) says that the peer's
    certificate failed verification here."""
    return any(marker in message for marker in CERTIFICATE_FAILURE_MARKERS)


def certificate_reason(message: str) -> str:
    """The part of a TLS error that says why verification failed (from the first marker on)."""
    for marker in CERTIFICATE_FAILURE_MARKERS:
        at = message.find(marker)
        if at >= 0:
            reason = message[at:].split(" (_ssl.c")[0].strip()
            return reason[:-len(": OK")] if reason.endswith(": OK") else reason
    return message


# Consecutive certificate-verification failures after which an agent ends: a wrong or missing CA
# fails every time; an outage never reads like one, and one odd handshake (a middlebox) is not enough.
CERTIFICATE_FAILURES_FATAL = 3


def certificate_config_error(peer: str, ca: object, setting: str, err: Exception,
                             attempts: int) -> ConfigError:
    """The one-line error an agent ends with when ``peer``'s certificate never verifies;
    ``setting`` names where the CA is configured."""
    against = f"the CA in {ca}" if ca else "the system's CAs (no CA is configured)"
    return ConfigError(
        f"TLS: the certificate of {peer} does not verify against {against}, {attempts} times in "
        f"a row ({certificate_reason(str(err))}); set {setting} to the fleet's ca.pem (made by "
        "`hulk-planner enroll --init-ca`) and use an address the certificate names (its "
        "--host), then restart")


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
    RequestTimeoutError: "DEADLINE_EXCEEDED",
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
    "DEADLINE_EXCEEDED": RequestTimeoutError,
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
    kind = FROM_GRPC_STATUS.get(name or "", HulkError)
    if kind is UnavailableError and is_certificate_failure(message):
        kind = CertificateError
    return kind(message)
