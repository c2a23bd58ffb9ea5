"""Probing by plan in serve: registration answers a bounded peer list that rotates every epoch,
heartbeats say when it changed (a fake clock for the pure bookkeeping; a real gRPC server and
SQLite store for the answer an agent gets)."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import grpc
import pytest

from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from hulk.wire.records import Peer
from planner.service.peer_plan import PeerPlanner, ProbePlanSettings
from planner.service.runtime import PlannerRuntime
from tests.helpers.clock import ManualClock


T0 = 1_000_000_000_000


def members(sites: str = "abc", per_site: int = 6):
    return [(Peer(f"{s}{i}", f"10.0.{ord(s)}.{i}", 0), s) for s in sites for i in range(per_site)]


def test_lists_are_bounded_rotate_each_epoch_and_are_flagged_when_changed():
    clock = ManualClock(T0)
    plan = PeerPlanner(members(), ProbePlanSettings(peer_bound=6, site_reps=1, epoch_s=60),
                       clock=clock)
    answers = {p.node_id: plan.answer(p.node_id) for p, _ in members()}
    assert all(0 < len(peers) <= 6 for peers in answers.values())
    assert not any(plan.changed(n) for n in answers)
    clock.now += 60_000  # every node is one epoch on (whatever its phase)
    moved = [n for n in answers if plan.changed(n)]
    assert len(moved) >= len(answers) // 3  # the nodes probing out this epoch or the last
    assert {n: plan.answer(n) for n in moved} != {n: answers[n] for n in moved}
    assert not any(plan.changed(n) for n in answers)
    # Epochs are staggered by node: at any time nodes are at most one epoch apart.
    epochs = {plan.epoch_of(n) for n in answers}
    assert max(epochs) - min(epochs) <= 1


def test_a_new_node_changes_its_sites_lists_and_a_move_changes_lists_naming_it():
    ticks = itertools.count()  # monotonic seconds: every replan is long enough ago
    plan = PeerPlanner(members("ab", 3), ProbePlanSettings(peer_bound=8, site_reps=1),
                       clock=ManualClock(T0), monotonic=lambda: float(next(ticks)))
    for p, _ in members("ab", 3):
        plan.answer(p.node_id)
    plan.update(Peer("a9", "10.9.9.9", 0), "a")
    assert {p.node_id for p in plan.answer("a9")} == {"a0", "a1", "a2", "b0", "b1", "b2"}
    assert all(plan.changed(n) for n in ("a0", "a1", "a2", "b0"))  # 7 nodes fit 8: full mesh
    for n in ("a0", "a1", "a2", "b0", "b1", "b2"):
        plan.answer(n)
    plan.update(Peer("b2", "10.7.7.7", 0), "b")                    # new address, same site
    assert plan.changed("a0") and Peer("b2", "10.7.7.7", 0) in plan.answer("a0")
    assert plan.peers_for("ghost") == () and not plan.changed("ghost")


def test_after_a_restart_the_first_heartbeat_takes_the_list_as_given():
    plan = PeerPlanner(members(), ProbePlanSettings(peer_bound=6), clock=ManualClock(T0))
    assert not plan.changed("a0")


def test_replans_are_rate_limited_by_their_own_cost():
    fake = [0.0]
    plan = PeerPlanner(members("abcd", 10), ProbePlanSettings(peer_bound=8), clock=ManualClock(0),
                       monotonic=lambda: fake[0], replan_gap=1e9, throttle_from_s=0.0)
    plan.answer("a0")
    plan.update(Peer("a-new", "10.1.1.1", 0), "a")
    provisional = plan.answer("a-new")  # the plan is too recent to redo: its own site
    assert {p.node_id for p in provisional} == {f"a{i}" for i in range(8)}
    assert plan.replans == 1


async def register(stub, node_id: str, city: str, address: str):
    return await stub.Register(hulk_pb2.RegisterRequest(
        node_id=node_id, hostname=node_id, agent_version="test", address=address,
        location=hulk_pb2.Location(city=city),
        inventory=hulk_pb2.GpuInventory(unavailable_reason="test")), timeout=10)


@pytest.mark.slow
async def test_registration_through_grpc_gives_a_bounded_list_that_rotates(tmp_path: Path):
    cities = ["Paris", "Rome", "Tokyo", "Sydney"]
    runtime = PlannerRuntime(str(tmp_path / "p.db"), "127.0.0.1:0",
                             probe=ProbePlanSettings(peer_bound=5, site_reps=1, epoch_s=0.4))
    port = await runtime.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = hulk_pb2_grpc.PlannerStub(channel)
            nodes = [(f"{c.lower()}-{i}", c, f"127.0.{k}.{i + 1}")
                     for k, c in enumerate(cities) for i in range(5)]
            for node in nodes:
                await register(stub, *node)
            answers = {}
            for node in nodes:
                answer = await register(stub, *node)
                answers[node[0]] = {p.node_id for p in answer.peers}
                assert 0 < len(answer.peers) <= 5
                assert all(p.address.startswith("127.0.") for p in answer.peers)
            assert set().union(*answers.values()) <= {n for n, _, _ in nodes}
            # 19 others do not fit 5 peers: each node's own city, and some probe other cities.
            city = {n: c for n, c, _ in nodes}
            pairs = {(city[n], city[p]) for n, peers in answers.items() for p in peers}
            assert {(c, c) for c in cities} <= pairs and len(pairs) > len(cities)
            rotated = False
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not rotated:
                await asyncio.sleep(0.2)
                beat = await stub.Heartbeat(hulk_pb2.HeartbeatRequest(node_id="paris-0"),
                                            timeout=10)
                if beat.peers_changed:
                    again = await register(stub, "paris-0", "Paris", "127.0.0.1")
                    rotated = {p.node_id for p in again.peers} != answers["paris-0"]
            assert rotated
    finally:
        await runtime.stop(grace_s=0)
