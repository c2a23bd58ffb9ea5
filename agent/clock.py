"""Time as an interface: wall clock for timestamps, monotonic for intervals, and sleeping."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Unix epoch seconds (timestamps that leave the agent)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps (scheduling)."""

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def epoch_ms(clock: Clock) -> int:
    return int(clock.now() * 1000)
