"""Serve's collaborators for in-process tests of the lifecycle and recovery: nodes a test drives,
the current plan over an in-memory broker, job records over a real store."""

from __future__ import annotations

from typing import Any

from hulk.wire.placement import parse_placement
from planner.core.fleet import Network
from planner.core.lifecycle import RankState
from planner.service.node_rows import NodeRecord
from planner.service.publisher import InMemoryPublisher, RetainedPlan
from planner.service.seams import ServeOptions, StoreDirectory
from planner.service.store import Store
from tests.helpers.signing import SIGNER, VERIFIER

FLEET = "lab"
OPTIONS = ServeOptions(fleet=FLEET, node_timeout_s=3)


class FakeNodes:
    """A ``NodeDirectory`` a test drives: ``seen`` (node id -> last heartbeat, ms; only these
    nodes have agents), ``launch`` (node id -> its last launch report) and the network ``net``."""

    def __init__(self, net: Network, seen: dict[str, int | None] | None = None):
        self.net = net
        self.seen = {} if seen is None else seen        # the test's own dict, changed in place
        self.launch: dict[str, RankState] = {}
        self.revoked: set[str] = set()                  # nodes whose credentials were revoked

    async def nodes(self) -> list[NodeRecord]:
        return [NodeRecord(n, "agent", address="127.0.0.1", last_seen_ms=t,
                           launch=self.launch.get(n), revoked=n in self.revoked)
                for n, t in self.seen.items()]

    async def network(self) -> Network:
        return self.net

    def report(self, nodes, state: str, job: str, plan_id: str, code: int = 0) -> None:
        """What the agents of ``nodes`` report about their launched process."""
        for n in nodes:
            self.launch[n] = RankState(state=state, job=job, plan_id=plan_id, exit_code=code)


def is_clear(payload: bytes | None) -> bool:
    """Whether ``payload`` is a signed placement without roles: how the planner clears a node."""
    return bool(payload) and parse_placement(payload, verifier=VERIFIER).roles == ()


def current_plan(broker: InMemoryPublisher, signer=SIGNER) -> RetainedPlan:
    """The current plan of fleet ``lab`` on ``broker``, verified with ``signer``'s key."""
    return RetainedPlan(broker, fleet=FLEET, signer=signer)


async def _here(fn, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def store_jobs(store: Store) -> StoreDirectory:
    """The job records of ``store`` as serve reads them (on the test's own thread)."""
    return StoreDirectory(store, _here, fleet=FLEET, window_days=90)
