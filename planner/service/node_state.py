"""A node's state as every view tells it: `fleet show`, the metrics and the fleet read plans use.

- ``revoked``: every credential of the node was revoked (``hulk-planner revoke``); it is never
  planned on, whatever it last reported.
- ``imported``: known from a fleet file only (no agent calls, so it is never silent).
- ``silent``: its agent has not called for longer than the node timeout (serve's
  ``--node-timeout``); what it last reported running is no longer known to be true.
- ``alive``: the rest.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from planner.security.credentials import revoked_node_ids

ALIVE, SILENT, REVOKED, IMPORTED = "alive", "silent", "revoked", "imported"
NODE_STATES = (ALIVE, SILENT, REVOKED, IMPORTED)


def revoked_nodes(store: Any) -> frozenset[str]:
    """The revoked node ids in ``store``'s file (a ``planner.service.store.Store``)."""
    with store.database.reading("read revoked nodes") as conn:
        return revoked_node_ids(conn)


def node_state(row: Mapping[str, Any], *, now_ms: int, node_timeout_s: float,
               revoked: Collection[str] = ()) -> str:
    """The state of one ``Store.nodes`` row at ``now_ms``."""
    if row["id"] in revoked:
        return REVOKED
    if row.get("source") == "import":
        return IMPORTED
    last = row.get("last_seen_ms")
    alive = last is not None and now_ms - last <= node_timeout_s * 1000
    return ALIVE if alive else SILENT
