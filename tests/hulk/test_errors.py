"""The exception tree: its drawn shape, that every class is raised somewhere, and the one table
between errors and gRPC status codes, both ways."""

from __future__ import annotations

import re

import grpc
import pytest

from hulk import errors
from hulk.errors import (BatchTooLargeError, ConfigError, HulkError, InputError, NotFoundError,
                         PermissionDeniedError, PlanningError, RateLimitedError,
                         RequestTimeoutError, StoreError,
                         UnauthenticatedError, UnavailableError, from_grpc, grpc_status)
from tests.helpers.paths import REPO

TREE = [cls for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, HulkError)]


def drawn_tree() -> dict[str, tuple[str | None, int, str]]:
    """class name -> (drawn parent, drawn exit code, drawn status), read from the docstring."""
    drawn: dict[str, tuple[str | None, int, str]] = {}
    parents: list[str] = []          # the open branch, one name per depth
    for line in errors.__doc__.splitlines():
        match = re.match(r"^( *)((?:\|   |    )*)(?:\+-- )?([A-Z]\w*Error) +exit (\d) +([A-Z_]+)$",
                         line)
        if not match:
            continue
        depth = len(match.group(2)) // 4 + (1 if "+-- " in line else 0)
        name = match.group(3)
        del parents[depth:]
        drawn[name] = (parents[-1] if parents else None, int(match.group(4)), match.group(5))
        parents.append(name)
    return drawn


def test_the_docstring_draws_the_whole_tree_as_it_is():
    drawn = drawn_tree()
    assert set(drawn) == {cls.__name__ for cls in TREE}
    for cls in TREE:
        parent, exit_code, status = drawn[cls.__name__]
        expected_parent = None if cls is HulkError else cls.__bases__[0].__name__
        assert parent == expected_parent, cls
        assert exit_code == cls.exit_code, cls
        assert status == grpc_status(cls("x")).name, cls


def source_outside_errors_py() -> str:
    files = [path for folder in ("agent", "planner", "hulk") for path in (REPO / folder).rglob("*.py")
             if path != REPO / "hulk" / "errors.py" and "v1" not in path.relative_to(REPO).parts]
    return "\n".join(path.read_text(encoding="utf-8") for path in files)


@pytest.mark.parametrize("cls", [c for c in TREE if c is not HulkError], ids=lambda c: c.__name__)
def test_every_class_of_the_tree_is_raised_somewhere(cls):
    # `raise NotFoundError(...)`, `raise errors.StoreError(...)`, or an instance made to be
    # raised later (`exc = UnavailableError(...)`); a class statement is not a raise.
    pattern = rf"(raise (errors\.)?{cls.__name__}\b|(?<!class )\b{cls.__name__}\()"
    assert re.search(pattern, source_outside_errors_py()), \
        f"nothing in agent/, planner/ or hulk/ raises {cls.__name__}: raise it or remove it"


@pytest.mark.parametrize("error, code", [
    (InputError("bad"), grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError("bad"), grpc.StatusCode.INVALID_ARGUMENT),
    (BatchTooLargeError("10001 samples"), grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError("node n1"), grpc.StatusCode.NOT_FOUND),
    (PermissionDeniedError("as n2"), grpc.StatusCode.PERMISSION_DENIED),
    (UnauthenticatedError("no token"), grpc.StatusCode.UNAUTHENTICATED),
    (RateLimitedError("slow down"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (UnavailableError("broker"), grpc.StatusCode.UNAVAILABLE),
    (StoreError("disk full"), grpc.StatusCode.UNAVAILABLE),
    (PlanningError("no nodes"), grpc.StatusCode.INTERNAL),
    (HulkError("?"), grpc.StatusCode.INTERNAL),
    (ValueError("a bug"), grpc.StatusCode.INTERNAL),
])
def test_error_to_status(error, code):
    assert grpc_status(error) is code


def test_a_subclass_takes_its_nearest_listed_ancestors_status():
    class RowMissing(NotFoundError):
        pass

    assert grpc_status(RowMissing("r")) is grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("code, cls", [
    (grpc.StatusCode.INVALID_ARGUMENT, InputError),
    (grpc.StatusCode.NOT_FOUND, NotFoundError),
    (grpc.StatusCode.FAILED_PRECONDITION, NotFoundError),
    (grpc.StatusCode.PERMISSION_DENIED, PermissionDeniedError),
    (grpc.StatusCode.UNAUTHENTICATED, UnauthenticatedError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, RateLimitedError),
    (grpc.StatusCode.UNAVAILABLE, UnavailableError),
    (grpc.StatusCode.DEADLINE_EXCEEDED, RequestTimeoutError),   # an UnavailableError: retried
    (grpc.StatusCode.CANCELLED, UnavailableError),
    (grpc.StatusCode.ABORTED, UnavailableError),
    (grpc.StatusCode.INTERNAL, HulkError),
    (grpc.StatusCode.UNKNOWN, HulkError),
    (None, HulkError),
])
def test_status_to_error(code, cls):
    error = from_grpc(code, "planner Report: the message")
    assert type(error) is cls
    assert str(error) == "planner Report: the message"


def test_every_status_the_planner_answers_with_turns_back_into_an_error_with_that_status():
    for name in set(errors.GRPC_STATUS.values()):
        code = grpc.StatusCode[name]
        assert grpc_status(from_grpc(code, "m")) is code, name
