"""Polling until something holds: one loop for blocking tests, one for asyncio tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _poll(predicate: Callable[[], T], deadline: float, timeout: float, what: str,
          detail: Callable[[], object] | None) -> T:
    """``predicate()``; once it is still falsy past ``deadline``, AssertionError naming ``what``."""
    value = predicate()
    if not value and time.monotonic() > deadline:
        message = f"timed out after {timeout:g} s waiting for {what}"
        raise AssertionError(f"{message}: {detail()}" if detail else message)
    return value


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, what: str = "the condition", *,
               interval: float = 0.05, detail: Callable[[], object] | None = None) -> T:
    """Call ``predicate`` every ``interval`` s until it returns something truthy and return that;
    after ``timeout`` s raise AssertionError naming ``what`` (and ``detail()``, if given)."""
    deadline = time.monotonic() + timeout
    while not (value := _poll(predicate, deadline, timeout, what, detail)):
        time.sleep(interval)
    return value


async def wait_until_async(predicate: Callable[[], T], timeout: float = 10.0,
                           what: str = "the condition", *, interval: float = 0.02,
                           detail: Callable[[], object] | None = None) -> T:
    """``wait_until`` for a test on the event loop: sleeps with asyncio, so the loop runs on."""
    deadline = time.monotonic() + timeout
    while not (value := _poll(predicate, deadline, timeout, what, detail)):
        await asyncio.sleep(interval)
    return value
