"""A clock a test sets by hand: epoch milliseconds, called like the planner's clock."""

from __future__ import annotations


class ManualClock:
    """Returns ``now`` (ms) when called; tests move it by assigning or adding to ``now``."""

    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now
