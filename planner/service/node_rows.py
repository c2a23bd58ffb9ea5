"""The store's nodes: agents' registrations and heartbeats, peers, and the rows read back.

``NodeRows`` is one part of ``planner.service.store.Store``, built on its ``Database`` and clock.
``NodeRecord`` is a node row as the serve tasks and the ``jobs`` command read it (typed, frozen);
``nodes()`` gives every column as a plain dict for the exports that print or serialise them all
(``fleet show``, the dashboard, metrics).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from hulk.errors import NotFoundError
from hulk.wire.records import GpuInfo, LaunchStatus, Peer, RegisterRequest
from planner.core.lifecycle import RankState
from planner.core.probe_plan import site_key
from planner.service.database import Database
from planner.service.job_progress import store_progress
from planner.service.job_ranks import exit_cause_name, record_rank


@dataclass(frozen=True)
class NodeRef:
    """What ingest needs per node: its row index, where it is and its site (the one it
    declared, else its city: ``planner.core.probe_plan.site_key``)."""

    idx: int
    id: str
    city: str | None
    latitude: float | None
    longitude: float | None
    site: str | None = None


@dataclass(frozen=True)
class NodeRecord:
    """One node as the lifecycle, recovery and the ``jobs`` command read it."""

    id: str
    source: str                          # "agent" (registered) or "import" (a fleet file)
    address: str = ""                    # where its agent registered from ("" for imports)
    city: str = ""
    site: str | None = None
    last_seen_ms: int | None = None      # its last heartbeat or report
    launch: RankState | None = None      # its launched process, as it last reported it
    revoked: bool = False                # every credential revoked: never planned on, down at once

    @property
    def monitored(self) -> bool:
        """Sends heartbeats: only such nodes can be called silent."""
        return self.source != "import"


_RECORD_SQL = ("SELECT n.id, n.source, n.address, n.city, s.name, n.last_seen_ms, n.launch_state, "
               "n.launch_job, n.launch_plan_id, n.launch_exit_code, n.launch_detail, "
               "n.launch_exit_cause, n.launch_changed_ms FROM nodes n "
               "LEFT JOIN sites s ON s.idx = n.site_idx "
               "ORDER BY n.idx")


def _node_record(row: tuple) -> NodeRecord:
    node_id, source, address, city, site, seen, state, job, plan_id, code, detail, cause, \
        changed = row
    launch = None
    if state:
        launch = RankState(state=state, job=job or "", plan_id=plan_id or "", exit_code=code or 0,
                           detail=detail or "", exit_cause=cause or "", changed_ms=changed or 0)
    return NodeRecord(node_id, source or "agent", address or "", city or "", site, seen, launch)


class NodeRows:
    """Registrations, heartbeats and node reads over ``database``; times from ``clock`` (ms)."""

    def __init__(self, database: Database, clock: Callable[[], int]):
        self.database = database
        self.clock = clock

    def register(self, reg: RegisterRequest) -> tuple[NodeRef, bool]:
        """Insert or update a node from its agent's registration; returns (node, peers changed
        for others). The peers version goes up when a node is new or moves address/port. The
        node's site is the one it declares, else its city; registering with another moves it."""
        db = self.database
        t = self.clock()
        city = reg.location.city.strip() or None
        site = site_key(city, reg.location.site)
        latitude, longitude = reg.location.coordinates or (None, None)
        inventory = reg.inventory
        gpus_json = json.dumps([asdict(g) for g in inventory.gpus])
        gpu_name, cc, memory_gb = _summarise_gpus(inventory.gpus)
        with db.transaction("register") as conn:
            row = conn.execute("SELECT idx, address, probe_port FROM nodes WHERE id = ?",
                               (reg.node_id,)).fetchone()
            version = int(db.meta("peers_version", "0"))
            site_idx = db.site_index(conn, site)
            changed = row is None or row[1] != reg.address or row[2] != reg.probe_port
            if changed:
                version += 1
                db.set_meta(conn, "peers_version", version)
            values = {
                "id": reg.node_id, "source": "agent", "hostname": reg.hostname,
                "city": city, "latitude": latitude, "longitude": longitude,
                "agent_version": reg.agent_version, "gpus_json": gpus_json,
                "gpu_unavailable_reason": inventory.unavailable_reason,
                "driver_version": inventory.driver_version, "gpu_count": inventory.count,
                "gpus_declared": int(inventory.declared),
                "gpu_name": gpu_name, "compute_capability": cc, "memory_gb": memory_gb,
                "address": reg.address, "probe_port": reg.probe_port,
                "throughput_port": reg.throughput_port, "last_seen_ms": t,
                "allowed_commands_json": (json.dumps([list(p) for p in reg.allowed_commands])
                                          if reg.allowed_commands is not None else None),
                "registered_ms": t, "peers_version_seen": version, "site_idx": site_idx,
            }
            if row is None:
                values["first_seen_ms"] = t
                cols = ", ".join(values)
                conn.execute(f"INSERT INTO nodes ({cols}) VALUES ({', '.join('?' * len(values))})",
                             tuple(values.values()))
                idx = conn.execute("SELECT idx FROM nodes WHERE id = ?",
                                   (reg.node_id,)).fetchone()[0]
            else:
                idx = row[0]
                sets = ", ".join(f"{k} = ?" for k in values)
                conn.execute(f"UPDATE nodes SET {sets} WHERE idx = ?", (*values.values(), idx))
        return NodeRef(idx, reg.node_id, city, latitude, longitude, site), changed

    def node_refs(self) -> dict[str, NodeRef]:
        with self.database.reading("read nodes") as conn:
            rows = conn.execute(
                "SELECT n.idx, n.id, n.city, n.latitude, n.longitude, s.name FROM nodes n "
                "LEFT JOIN sites s ON s.idx = n.site_idx").fetchall()
        return {r[1]: NodeRef(*r) for r in rows}

    def peers(self, node_id: str) -> tuple[Peer, ...]:
        """Every other node registered by an agent, by id."""
        with self.database.reading("read peers") as conn:
            rows = conn.execute(
                "SELECT id, address, probe_port FROM nodes WHERE id != ? AND source = 'agent' "
                "ORDER BY id", (node_id,)).fetchall()
        return tuple(Peer(r[0], r[1] or "", r[2] or 0) for r in rows)

    def probe_members(self) -> list[tuple[Peer, str | None]]:
        """Every node registered by an agent, as a peer with its site (the one it declared,
        else its city; the probe plan's input), by id."""
        with self.database.reading("read peers") as conn:
            rows = conn.execute(
                "SELECT n.id, n.address, n.probe_port, s.name FROM nodes n LEFT JOIN sites s "
                "ON s.idx = n.site_idx WHERE n.source = 'agent' ORDER BY n.id").fetchall()
        return [(Peer(r[0], r[1] or "", r[2] or 0), r[3]) for r in rows]

    def heartbeat(self, node_id: str, *, spool_depth: int = 0, spool_dropped: int = 0,
                  launch: LaunchStatus | None = None, clock_skew_ms: int | None = None) -> bool:
        """Record liveness and the launch status (unless its state is unspecified) with its
        step progress (``planner.service.job_progress``) and its job's kept rank report
        (``planner.service.job_ranks``); returns whether the node's peer list
        changed since it registered. Raises NotFoundError for a node the store does not know."""
        t = self.clock()
        with self.database.transaction("heartbeat") as conn:
            row = conn.execute("SELECT idx, peers_version_seen FROM nodes WHERE id = ?",
                               (node_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"node {node_id!r} is not registered")
            sets = {"last_seen_ms": t, "spool_depth": spool_depth}
            if clock_skew_ms is not None:
                sets["clock_skew_ms"] = clock_skew_ms
            if launch is not None and launch.state:
                sets.update(launch_plan_id=launch.plan_id, launch_job=launch.job,
                            launch_state=launch.state.name.lower(),
                            launch_exit_code=launch.exit_code,
                            launch_exit_cause=exit_cause_name(launch),
                            launch_detail=launch.detail, launch_changed_ms=launch.changed_at_ms)
            assign = ", ".join(f"{k} = ?" for k in sets)
            conn.execute(f"UPDATE nodes SET {assign}, spool_dropped = "
                         "max(coalesce(spool_dropped, 0), ?) WHERE idx = ?",
                         (*sets.values(), spool_dropped, row[0]))
            if launch is not None and launch.state:
                store_progress(conn, row[0], node_id, launch, t)
                record_rank(conn, node_id, launch, t)
            version = int(self.database.meta("peers_version", "0"))
        return version > (row[1] or 0)

    def clock_skews(self) -> dict[str, int]:
        """node id -> its agent's clock minus the planner's, as its last heartbeat measured."""
        with self.database.reading("read clock skews") as conn:
            rows = conn.execute("SELECT id, clock_skew_ms FROM nodes "
                                "WHERE clock_skew_ms IS NOT NULL").fetchall()
        return dict(rows)

    def node_records(self) -> list[NodeRecord]:
        """Every node as a typed record, in registration order."""
        from dataclasses import replace

        from planner.security.credentials import revoked_node_ids

        with self.database.reading("read nodes") as conn:
            revoked = revoked_node_ids(conn)
            records = [_node_record(r) for r in conn.execute(_RECORD_SQL).fetchall()]
        return [replace(r, revoked=True) if r.id in revoked else r for r in records]

    def nodes(self) -> list[dict[str, Any]]:
        """Every node row with all its columns as a plain dict (GPU list decoded, ``site`` its
        site's name), for exports."""
        with self.database.reading("read nodes"):
            rows = list(self.database.db.query(
                "SELECT n.*, s.name AS site FROM nodes n LEFT JOIN sites s "
                "ON s.idx = n.site_idx ORDER BY n.idx"))
        for r in rows:
            r["gpus"] = json.loads(r.pop("gpus_json") or "[]")
            r.pop("site_idx", None)
            r.pop("allowed_commands_json", None)   # agents' launch policy: not a fleet fact
        return rows

    def allowed_commands(self) -> dict[str, tuple[tuple[str, ...], ...]]:
        """node id -> the argv prefixes its agent runs, for the agents that reported them."""
        with self.database.reading("read allowed commands") as conn:
            rows = conn.execute("SELECT id, allowed_commands_json FROM nodes WHERE source = 'agent' "
                                "AND allowed_commands_json IS NOT NULL").fetchall()
        out = {}
        for node, text in rows:
            try:
                out[node] = tuple(tuple(str(w) for w in p) for p in json.loads(text))
            except (ValueError, TypeError):
                continue
        return out


def _summarise_gpus(gpus: Iterable[GpuInfo]) -> tuple[str | None, float | None, float]:
    """(most common GPU name, its compute capability, total memory in GB) of an inventory."""
    gpus = list(gpus)
    if not gpus:
        return None, None, 0.0
    names: dict[str, int] = {}
    for g in gpus:
        names[g.name] = names.get(g.name, 0) + 1
    name = max(names, key=lambda k: names[k])
    cc = next(g.compute_capability for g in gpus if g.name == name) or None
    return name, cc, sum(g.memory_bytes for g in gpus) / 1e9
