"""A node's declared site: an agent may name its site (a data centre, cloud region or
city), so two data centres in one city are two sites in the probe plan, in the store and in the
fleet read from it; a registration without a site keeps its city as its site, as before; a bad
site is refused with INVALID_ARGUMENT and changes nothing. Real SQLite, real gRPC on loopback."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import grpc
import pytest

from agent.config import load_config
from agent.prober import PacketResult
from agent.reporter import GrpcPlannerClient
from agent.runtime import AgentRuntime
from agent.spool import Spool
from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from hulk.wire.records import Inventory, NodeLocation, Peer, RegisterRequest
from planner.service.graph import fleet_from_store
from planner.service.ingest import IngestService
from planner.service.peer_plan import PeerPlanner, ProbePlanSettings
from planner.service.runtime import PlannerRuntime
from planner.service.store import Store
from tests.helpers.waits import wait_until_async

# 7 nodes do not fit 3 peers, so the plan's grouping shows in the lists. One epoch of 11 days:
# the whole test reads one plan.
SETTINGS = ProbePlanSettings(peer_bound=3, site_reps=1, epoch_s=1e6)
# node -> (city, declared site); rome-0 is an agent from before sites (no site).
NODES = {"par-a0": ("Paris", "par-dc1"), "par-a1": ("Paris", "par-dc1"),
         "par-a2": ("Paris", "par-dc1"), "par-b0": ("Paris", "par-dc2"),
         "par-b1": ("Paris", "par-dc2"), "par-b2": ("Paris", "par-dc2"), "rome-0": ("Rome", "")}
ADDRESS = {n: f"127.0.0.{k + 2}" for k, n in enumerate(NODES)}
SITES = {n: site or city for n, (city, site) in NODES.items()}


def now_ms() -> int:
    return int(time.time() * 1000)


def planned(sites: dict[str, str]) -> dict[str, set[str]]:
    """Each node's peers in the probe plan of these sites (what serve should answer)."""
    plan = PeerPlanner([(Peer(n, ADDRESS[n], 0), s) for n, s in sites.items()], SETTINGS,
                       clock=now_ms)
    return {n: {p.node_id for p in plan.answer(n)} for n in sites}


async def register(stub, node_id: str, city: str, site: str) -> set[str]:
    answer = await stub.Register(hulk_pb2.RegisterRequest(
        node_id=node_id, hostname=node_id, agent_version="test", address=ADDRESS[node_id],
        location=hulk_pb2.Location(city=city, site=site),
        inventory=hulk_pb2.GpuInventory(unavailable_reason="test")), timeout=10)
    return {p.node_id for p in answer.peers}


async def test_two_sites_in_one_city_are_two_sites_in_the_plan_the_store_and_the_fleet(
        tmp_path: Path):
    by_city = {n: city for n, (city, _) in NODES.items()}
    assert planned(SITES) != planned(by_city)   # else this test could not tell them apart
    db = tmp_path / "planner.db"
    runtime = PlannerRuntime(str(db), "127.0.0.1:0", probe=SETTINGS)
    port = await runtime.start()

    def stored_nodes() -> list[dict]:
        return runtime.store_executor.submit(runtime.store.nodes).result(30)

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = hulk_pb2_grpc.PlannerStub(channel)
            for node, (city, site) in NODES.items():
                await register(stub, node, city, site)
            # Registered again once every node is known: the lists of the whole fleet's plan.
            answers = {n: await register(stub, n, *NODES[n]) for n in NODES}
            before = stored_nodes()
            for bad in ("dc\n1", "x" * 101, "dc\u200b"):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await register(stub, "par-a0", "Paris", bad)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                details = caught.value.details()
                assert details.startswith("location.site: expected ") and "\n" not in details
            assert stored_nodes() == before     # the refused re-registrations changed nothing
    finally:
        await runtime.stop(grace_s=0)
    assert answers == planned(SITES)

    with Store(db) as store:
        assert {r["id"]: r["site"] for r in store.nodes()} == SITES
        fleet = {n.id: (n.site, n.site_key) for n in fleet_from_store(store).nodes}
        # A site named after the node's city is no site of its own (rome-0, as before sites).
        assert fleet == {n: (site or None, site or city) for n, (city, site) in NODES.items()}
        # A planner started on this store plans with the declared sites (probe_members).
        restarted = IngestService(store, probe=SETTINGS)
        assert {n: {p.node_id for p in restarted.peer_plan.answer(n)} for n in NODES} == \
            planned(SITES)
        # Re-registering with another site moves the node: store, plan and fleet.
        moved = {**SITES, "par-a0": "par-dc2"}
        answer = restarted.register(RegisterRequest(
            "par-a0", location=NodeLocation("Paris", site="par-dc2"), address=ADDRESS["par-a0"]))
        assert {p.node_id for p in answer.peers} == planned(moved)["par-a0"]
        assert {r["id"]: r["site"] for r in store.nodes()} == moved
        assert {n.id: n.site_key for n in fleet_from_store(store).nodes} == moved
        # Back to no site: its city again.
        restarted.register(RegisterRequest("par-a0", location=NodeLocation("paris"),
                                           address=ADDRESS["par-a0"]))
        node = next(n for n in fleet_from_store(store).nodes if n.id == "par-a0")
        assert (node.site, node.site_key) == (None, "Paris")


def test_a_registration_without_a_site_keeps_its_city_as_its_site(tmp_path: Path):
    with Store(tmp_path / "p.db") as store:
        for node_id, location in [("a", NodeLocation(" paris ")), ("b", NodeLocation("Rome")),
                                  ("c", NodeLocation("Rome", site="   ")), ("d", NodeLocation())]:
            ref, _ = store.register(RegisterRequest(node_id, location=location))
            assert ref.site == {"a": "Paris", "b": "Rome", "c": "Rome", "d": None}[node_id]
        assert [(p.node_id, site) for p, site in store.probe_members()] == \
            [("a", "Paris"), ("b", "Rome"), ("c", "Rome"), ("d", None)]
        assert {n: r.site for n, r in store.node_refs().items()} == \
            {"a": "Paris", "b": "Rome", "c": "Rome", "d": None}
        assert [(n.site, n.site_key) for n in fleet_from_store(store).nodes] == \
            [(None, "Paris"), (None, "Rome"), (None, "Rome"), (None, None)]


class AnsweringPinger:
    async def ping(self, address, count, timeout_s, payload_bytes, gap_s):
        return [PacketResult(sent_at=time.time(), rtt_ms=0.5) for _ in range(count)]


async def test_an_agent_configured_with_a_site_registers_in_it(tmp_path: Path):
    runtime = PlannerRuntime(str(tmp_path / "planner.db"), "127.0.0.1:0")
    port = await runtime.start()
    config = load_config({"planner": f"127.0.0.1:{port}", "node_id": "tok-1", "insecure": "1",
                          "address": "127.0.0.1", "state_dir": str(tmp_path), "city": "Tokyo"},
                         env_reader={"HULK_SITE": "tok-dc3"}.get)
    agent = AgentRuntime(
        config, client=GrpcPlannerClient.connect(config.planner, insecure=True),
        spool=Spool(config.spool_path, config.spool_max), pinger=AnsweringPinger(),
        inventory_reader=lambda: Inventory(unavailable_reason="test host"),
        heartbeat_interval_s=0.2, report_linger_s=0.2, rng=random.Random(1))

    def sites() -> dict[str, tuple[str | None, str | None]]:
        rows = runtime.store_executor.submit(runtime.store.nodes).result(30)
        return {r["id"]: (r["city"], r["site"]) for r in rows}

    task = asyncio.create_task(agent.run())
    try:
        await wait_until_async(sites, timeout=20)
        seen = sites()
    finally:
        agent.request_stop()
        assert await asyncio.wait_for(task, timeout=20) == 0
        await runtime.stop(grace_s=0)
    assert seen == {"tok-1": ("Tokyo", "tok-dc3")}
