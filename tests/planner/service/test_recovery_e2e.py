"""End to end on loopback: mosquitto, `hulk-planner serve --mqtt`, `plan --push`, real agents.

Agents are the real AgentRuntime with the real gRPC client, spool, subscriber and launcher; two
edges are injected: the GPU inventory (8 x A100 each, so the planner has memory to plan with on a
machine without GPUs) and the launcher's command (a Python sleep instead of torchrun, so five
agents do not start five torch processes on two cores). One agent is stopped; the test measures
the time from that moment until the affected job's new placement is on a surviving agent.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from hulk.wire.broker import parse_broker_url, placement_topic, plan_topic
from hulk.wire.placement import parse_summary
from planner.service.publisher import MqttPublisher
from tests.helpers.agents import A100, Agent
from tests.helpers.processes import run_cli, start_planner
from tests.helpers.serve import is_clear
from tests.helpers.signing import write_signing_key
from tests.helpers.waits import wait_until_async

pytestmark = pytest.mark.process

NODES = [f"lab-{i}" for i in range(5)]
NODE_TIMEOUT_S = 3.0


def fleet_file(path: Path) -> Path:
    """The five nodes in one city, every pair measured at 2 ms (links the planner plans with)."""
    nodes = [{"id": n, "city": "Beijing", "gpus": 8, "gpu_name": A100.name, "compute_capability": 8.0,
              "memory_gb": 320} for n in NODES]
    links = [{"src": a, "dst": b, "rtt_ms": 2.0, "bandwidth_gbps": None, "loss": 0.0, "samples": 10}
             for i, a in enumerate(NODES) for b in NODES[i + 1:]]
    path.write_text(json.dumps({"nodes": nodes, "links": links}))
    return path


@pytest.fixture
def planner_serve(broker, tmp_path):
    db = tmp_path / "planner.sqlite"
    imported = run_cli("fleet", "import", fleet_file(tmp_path / "fleet.json"), "--db", db)
    assert imported.returncode == 0, imported.stderr
    planner = start_planner(db, extra=(
        "--fleet-name", "lab", "--mqtt", broker.url, "--node-timeout", str(NODE_TIMEOUT_S),
        "--signing-key", write_signing_key(tmp_path / "signing.key"),
        "--recovery-interval", "0.25", "--rollup-seconds", "1"))
    try:
        yield {"db": db, "target": planner.address, "log": planner.log,
               "key": str(tmp_path / "signing.key")}
    finally:
        planner.stop()


async def test_a_silent_node_gets_its_jobs_replanned_and_pushed_within_the_timeout(broker, planner_serve, tmp_path):
    agents = {n: Agent(n, planner_serve["target"], broker.url, tmp_path / n) for n in NODES}
    for agent in agents.values():
        agent.start()
    try:
        await wait_until_async(
            lambda: all(a.component.subscriber and a.component.subscriber.connected.is_set()
                        for a in agents.values()), 30, "agents registered and subscribed")
        jobs = tmp_path / "jobs.yaml"
        jobs.write_text("jobs:\n"
                        "  - {name: a, model: gpt2-xl, command: 'python train.py'}\n"
                        "  - {name: b, model: bert-large, command: 'python train.py'}\n")
        pushed = await asyncio.to_thread(run_cli, "plan", str(jobs), "--db", str(planner_serve["db"]),
                                         "--no-compare", "--push", "--mqtt", broker.url,
                                         "--fleet-name", "lab", "--signing-key", planner_serve["key"])
        assert pushed.returncode == 0, pushed.stderr + pushed.stdout
        assert "pushed to" in pushed.stdout
        publisher = MqttPublisher(parse_broker_url(broker.url))
        summary = parse_summary(await publisher.read_retained(plan_topic("lab")))
        nodes_of = {j.name: j.node_ids for j in summary.jobs}
        assert set(nodes_of) == {"a", "b"}
        # Every agent holds exactly its own role(s).
        await wait_until_async(
            lambda: all((a.placement is not None) == any(n in v for v in nodes_of.values())
                        for n, a in agents.items()), 10, "placements on the agents")
        for n, agent in agents.items():
            if agent.placement is not None:
                assert agent.placement.node == n
                assert {r.job for r in agent.placement.roles} == {j for j, v in nodes_of.items() if n in v}
        # Launch states reach the planner through the heartbeat and `fleet show` prints them.
        await wait_until_async(lambda: all(a.runtime.launch_status.state.name == "RUNNING"
                                           for a in agents.values() if a.placement), 10,
                               "running jobs")
        await asyncio.sleep(1.0)
        shown = await asyncio.to_thread(run_cli, "fleet", "show", "--db", str(planner_serve["db"]))
        assert shown.returncode == 0, shown.stderr
        assert "RUNNING" in shown.stdout.upper()

        victim = nodes_of["a"][-1]
        b_nodes = set(nodes_of["b"])
        b_changes = {n: agents[n].component.subscriber.current for n in b_nodes}
        survivors = [n for n in NODES if n != victim]
        old_a = {n: agents[n].placement for n in survivors}

        t_loss = time.monotonic()
        await agents[victim].stop()

        def replanned() -> bool:
            for n in survivors:
                p = agents[n].placement
                if p is not None and p != old_a[n] and any(r.job == "a" for r in p.roles):
                    return True
            return False

        await wait_until_async(replanned, NODE_TIMEOUT_S + 10, "the new placement of job a")
        elapsed = time.monotonic() - t_loss
        print(f"\nloss-to-new-placement: {elapsed:.2f} s (node timeout {NODE_TIMEOUT_S:g} s)")
        assert elapsed < NODE_TIMEOUT_S + 5

        new_summary = parse_summary(await publisher.read_retained(plan_topic("lab")))
        new_nodes = {j.name: j.node_ids for j in new_summary.jobs}
        assert victim not in new_nodes.get("a", []) and new_nodes["b"] == nodes_of["b"]
        assert {j.name: j.plan_id for j in new_summary.jobs}["b"] == summary.plan_id
        for n in b_nodes - set(new_nodes.get("a", [])):                 # job b's nodes: untouched
            assert agents[n].component.subscriber.current == b_changes[n]
        assert is_clear(await publisher.read_retained(placement_topic("lab", victim), wait_s=0.3))
        serve_log = planner_serve["log"].read_text()
        assert "recovery: re-planned ['a']" in serve_log, serve_log[-3000:]
    finally:
        await asyncio.gather(*(a.stop() for a in agents.values()), return_exceptions=True)
