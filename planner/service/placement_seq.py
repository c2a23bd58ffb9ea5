"""Placement sequence numbers: each node's placements carry a ``seq`` that only grows.

The agent keeps the highest ``seq`` it accepted and refuses anything older (agent/placement.py),
so a captured placement cannot be replayed once a newer one was sent, a clear included. The rule
is ``seq = max(now_ms, last + 1)`` per node: near the clock, so a planner that lost its record
(``plan --push`` keeps none) still issues numbers above the ones before it, and above the last
one even when the clock goes back.

- :class:`ClockSequence`: the last numbers in memory (one ``plan --push``, tests).
- :class:`StoreSequence`: the last numbers in the store's ``placement_seq`` table, so they keep
  growing across restarts of serve.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from hulk.wire.placement import MAX_SEQ


class PlacementSequence(Protocol):
    def next(self, nodes: Iterable[str], now_ms: int) -> dict[str, int]:
        """For each node a number above every one issued to it before."""


def _following(last: int | None, now_ms: int) -> int:
    seq = max(int(now_ms), (last or 0) + 1)
    if seq > MAX_SEQ:
        raise OverflowError(f"placement sequence past {MAX_SEQ}")
    return seq


class ClockSequence:
    """Sequence numbers kept in memory."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}

    def next(self, nodes: Iterable[str], now_ms: int) -> dict[str, int]:
        out = {node: _following(self.last.get(node), now_ms) for node in nodes}
        self.last.update(out)
        return out


class StoreSequence:
    """Sequence numbers kept in ``database``'s ``placement_seq`` table (a
    ``planner.service.database.Database`` or a ``Store``: anything with ``transaction(what)``);
    one transaction per call, so two instances on one file never issue the same number."""

    def __init__(self, database: Any):
        self.database = database

    def next(self, nodes: Iterable[str], now_ms: int) -> dict[str, int]:
        nodes = list(dict.fromkeys(nodes))
        if not nodes:
            return {}
        with self.database.transaction("placement sequence") as conn:
            last: dict[str, int] = {}
            for start in range(0, len(nodes), 500):     # SQLite's variable limit
                chunk = nodes[start:start + 500]
                marks = ",".join("?" * len(chunk))
                last.update(conn.execute(f"SELECT node_id, seq FROM placement_seq WHERE node_id "
                                         f"IN ({marks})", chunk).fetchall())
            out = {node: _following(last.get(node), now_ms) for node in nodes}
            conn.executemany("INSERT OR REPLACE INTO placement_seq (node_id, seq) VALUES (?, ?)",
                             list(out.items()))
        return out
