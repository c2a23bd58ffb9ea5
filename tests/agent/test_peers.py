"""Peers the planner names: a name that does not resolve must delay no other peer,
and a peer the agent cannot probe (a bad port, a bad address) costs one warning line, never a
traceback a round."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.config import load_config
from agent.peers import PeerResolver, peer_problem
from agent.reporter import GrpcPlannerClient
from agent.runtime import AgentRuntime
from agent.spool import Spool
from hulk.v1 import hulk_pb2
from hulk.wire.records import Inventory, Peer
from tests.helpers.paths import REPO
from tests.helpers.planner_double import PlannerDouble, start_server
from tests.helpers.waits import wait_until_async


def agent_command() -> list[str]:
    script = Path(sys.executable).parent / "hulk-agent"
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent"]


class BlackholeDns:
    """A name server on 127.53.x.y:53 that reads every query and answers none (UDP and TCP)."""

    def __init__(self):
        self.address = f"127.53.{os.getpid() % 250 + 1}.{random.randrange(1, 250)}"
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((self.address, 53))
        self.tcp = socket.socket()
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind((self.address, 53))
        self.tcp.listen(16)
        self.queries = 0
        self._thread = threading.Thread(target=self._swallow, daemon=True)
        self._thread.start()

    def _swallow(self) -> None:
        while True:
            try:
                self.udp.recvfrom(4096)
            except OSError:
                return
            self.queries += 1

    def close(self) -> None:
        self.udp.close()
        self.tcp.close()


@pytest.mark.root
@pytest.mark.process
async def test_an_unresolvable_peer_name_delays_no_other_peer(tmp_path: Path):
    """The real agent, in a mount namespace whose resolv.conf names a server that never
    answers; peers 127.0.0.2 and 127.0.0.3 answer ICMP, stall.hulk-test.example never resolves."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a private /etc/resolv.conf)")
    dns = BlackholeDns()
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {dns.address}\noptions timeout:3 attempts:2\n")
    planner = PlannerDouble(
        peers=[("good-2", "127.0.0.2", 0), ("stalls", "stall.hulk-test.example", 0),
               ("good-3", "127.0.0.3", 0)],
        settings=hulk_pb2.ProbeSettings(interval_s=1.0, packets_per_round=1, timeout_s=0.5,
                                        max_batch=50))
    server, port = await start_server(planner)
    log_path = tmp_path / "agent.log"
    with open(log_path, "w") as log_file:
        agent = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv), *agent_command(),
             "--planner", f"127.0.0.1:{port}", "--node-id", "a1", "--address", "127.0.0.1",
             "--state-dir", str(tmp_path / "state"), "--insecure", "--log-level", "INFO"],
            cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        await wait_until_async(lambda: planner.seen.registers, timeout=30)
        await asyncio.sleep(9.0)
        await wait_until_async(lambda: dns.queries > 0, timeout=5)   # the name really was looked up
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            exit_code = await asyncio.to_thread(agent.wait, 30)
        finally:
            if agent.poll() is None:
                agent.kill()
            await server.stop(None)
            dns.close()
    output = log_path.read_text()
    assert exit_code == 0, output
    for peer in ("good-2", "good-3"):
        # A round a second for 9 s (the prober may start a round up to 0.5 s late, and skips
        # one still running); before the fix, each lookup of the bad name stalled the whole
        # agent for 6 s (two tries of 3 s), and these peers got nothing at all.
        sent = sorted({r.at_ms for r in planner.stored_rounds() if r.peer_id == peer})
        assert len(sent) >= 6, (peer, len(sent), output)
        gaps = [b - a for a, b in zip(sent, sent[1:])]
        assert max(gaps) < 2600, (peer, gaps, output)
    assert not [r for r in planner.stored_rounds() if r.peer_id == "stalls"]
    assert output.count("cannot resolve") == 1, output
    assert "Traceback" not in output


class TcpOnlyPlanner(PlannerDouble):
    """Answers every Heartbeat with reregister, so the agent gets its peer list again and
    again."""

    async def Heartbeat(self, request, context):
        self.reregister_next = True
        return await super().Heartbeat(request, context)


@pytest.mark.slow
async def test_a_bad_peer_costs_one_warning_and_no_traceback(tmp_path: Path, caplog):
    """TCP-only probing (no ICMP socket): a peer with port 70000 made every round of every
    agent log a traceback."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    good_port = listener.getsockname()[1]
    planner = TcpOnlyPlanner(
        peers=[("good", "127.0.0.1", good_port), ("bad-port", "127.0.0.1", 70000),
               ("no-address", "", good_port), ("long-address", "a" * 300, good_port),
               ("odd-address", "not an address!", good_port), ("", "127.0.0.1", good_port)],
        settings=hulk_pb2.ProbeSettings(interval_s=0.3, packets_per_round=1, timeout_s=0.5,
                                        max_batch=20))
    server, port = await start_server(planner)
    config = load_config({"planner": f"127.0.0.1:{port}", "node_id": "tcp-only",
                          "address": "127.0.0.1", "state_dir": str(tmp_path), "insecure": "1"},
                         env_reader=lambda name: None)
    runtime = AgentRuntime(
        config, client=GrpcPlannerClient.connect(config.planner, insecure=True),
        spool=Spool(config.spool_path, config.spool_max), pinger=None,
        inventory_reader=lambda: Inventory(unavailable_reason="test host"),
        heartbeat_interval_s=0.2, report_linger_s=0.2, rng=random.Random(4))
    caplog.set_level(logging.INFO)
    task = asyncio.create_task(runtime.run())
    try:
        await wait_until_async(lambda: len(planner.seen.registers) >= 4 and sum(
            r.packets for r in planner.stored_rounds() if r.peer_id == "good") >= 8, timeout=20)
    finally:
        runtime.request_stop()
        assert await asyncio.wait_for(task, timeout=20) == 0
        await server.stop(None)
        listener.close()
    assert {r.peer_id for r in planner.stored_rounds()} == {"good"}
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
    skipped = [r.getMessage() for r in caplog.records if "skipping peer" in r.getMessage()]
    assert len(skipped) == 5, skipped                        # one line per bad peer, once
    assert any("70000" in line for line in skipped)
    assert runtime.prober.peer_count == 1


# ----------------------------------------------------------------------------- pure logic

@pytest.mark.parametrize("peer, problem", [
    (Peer("n", "10.0.0.1", 0), None),
    (Peer("n", "2001:db8::1", 65535), None),
    (Peer("n", "gpu-7.example.org", 7411), None),
    (Peer("n", "10.0.0.1", 65536), "probe port 65536 is outside 0-65535"),
    (Peer("n", "10.0.0.1", -1), "probe port -1 is outside 0-65535"),
    (Peer("n", "", 0), "no address"),
    (Peer("n", "x" * 254, 0), "an address of 254 characters"),
    (Peer("n", "a b", 0), "address 'a b' is neither an IP address nor a host name"),
    (Peer("n", "evil\x00.example", 0), "neither an IP address nor a host name"),
    (Peer("", "10.0.0.1", 0), "unusable node id ''"),
    (Peer("n\x00", "10.0.0.1", 0), "unusable node id"),
    (Peer("n" * 256, "10.0.0.1", 0), "unusable node id"),
])
def test_peer_problem(peer, problem):
    found = peer_problem(peer)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


async def test_resolver_caches_answers_and_failures_and_shares_a_running_lookup():
    calls: list[str] = []
    release = threading.Event()
    now = [0.0]

    def lookup(name: str) -> str | None:
        calls.append(name)
        if name == "slow.example":
            release.wait(5)
            return None
        return {"gpu.example": "192.0.2.7"}.get(name)

    resolver = PeerResolver(timeout_s=0.2, ttl_s=300, negative_ttl_s=60, lookup=lookup,
                            monotonic=lambda: now[0])
    assert await resolver.resolve("192.0.2.1") == "192.0.2.1" and calls == []
    assert await resolver.resolve("gpu.example") == "192.0.2.7"
    assert await resolver.resolve("gpu.example") == "192.0.2.7" and calls == ["gpu.example"]
    assert await resolver.resolve("gone.example") is None
    assert await resolver.resolve("gone.example") is None
    assert calls.count("gone.example") == 1                    # failures are cached too
    assert await asyncio.gather(*(resolver.resolve("slow.example") for _ in range(5))) \
        == [None] * 5                                        # timed out, one lookup for all
    assert await resolver.resolve("slow.example") is None and calls.count("slow.example") == 1
    release.set()
    await wait_until_async(lambda: "slow.example" in resolver._cache, timeout=5)
    now[0] = 61.0                                            # the failure expires
    assert await resolver.resolve("gone.example") is None and calls.count("gone.example") == 2
    assert await resolver.resolve("gpu.example") == "192.0.2.7" and calls.count("gpu.example") == 1
