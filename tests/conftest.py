"""Fixtures shared by every test area, and the `process` marker's bookkeeping.

A test that starts another process (hulk-planner or hulk-agent, mosquitto, torchrun, `ip netns`,
any subprocess) is marked `process`: `make test-fast` leaves those out. Tests using a fixture in
PROCESS_FIXTURES are marked here; the others say `pytest.mark.process` themselves. A test that
starts a process without the marker fails, so the fast lane stays free of them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hypothesis import settings as hypothesis_settings

from tests.helpers.broker import broker  # noqa: F401  (a real mosquitto, for any test area)
from tests.helpers.paths import REPO, SHARED

# pytest keeps the test modules it rewrites as byte-code only where byte-code may be written:
# with PYTHONDONTWRITEBYTECODE set, every run would rewrite and compile them all afresh (about
# 5 s of a fast-lane run). The files go to the ignored __pycache__ folders.
sys.dont_write_bytecode = False

# Property tests draw the same examples on every run (CI included): a failure is reproducible
# and a green run means the same thing twice. HYPOTHESIS_PROFILE=explore draws new ones.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Fixtures that start a process (`ip`, `sh`, mosquitto) for the tests that use them.
PROCESS_FIXTURES = frozenset({"broker", "lab_host", "icmp_blocked_host", "lab_available",
                              "root_only"})

# Audit events (docs.python.org/3/library/audit_events.html) raised when a process is started.
_SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn",
                           "os.fork", "os.forkpty"})
_unmarked_test: list[str] = []   # the node id of the test being set up or run, if not `process`
_refusals: list[str] = []        # what it tried, reported again at teardown should it be caught


def _refuse_processes_in_unmarked_tests(event: str, args: tuple) -> None:
    if _unmarked_test and event in _SPAWN_EVENTS:
        what = args[0] if args else ""
        _refusals.append(f"{_unmarked_test[0]} starts a process ({event} {what!r}) but is not "
                         "marked: add @pytest.mark.process (see docs/CONVENTIONS.md)")
        raise RuntimeError(_refusals[-1])


sys.addaudithook(_refuse_processes_in_unmarked_tests)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark users of PROCESS_FIXTURES before `-m` deselects (tryfirst: ahead of the mark plugin)."""
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.process)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """From setup to the end of the call, a test not marked `process` may not start a process.
    (Teardown is free: it may end a module fixture that an earlier, marked test started.)"""
    if item.get_closest_marker("process") is None:
        _unmarked_test[:] = [item.nodeid]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item):
    """Fails the test (after its fixtures are torn down) if it tried to start a process unmarked,
    even when the test caught the RuntimeError."""
    _unmarked_test.clear()
    result = yield
    refusals, _refusals[:] = list(_refusals), []
    if refusals:
        pytest.fail(refusals[0], pytrace=False)
    return result


@pytest.fixture(scope="session")
def repo_dir() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared beside the checkout: the paper's data and job sets (never copied into the repo)."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not beside this checkout")
    return SHARED


@pytest.fixture(scope="session")
def paper_fleet_dir(shared_dir: Path) -> Path:
    return shared_dir / "data" / "hulk-upstream"
