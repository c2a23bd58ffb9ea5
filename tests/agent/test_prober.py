"""The prober with real ICMP (we are root), real TCP connects, namespaces for loss."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import sys
import struct
import time

import pytest

from agent.icmp import IcmpPinger, choose_icmp_mode, detect_icmp_mode, parse_icmp
from agent.prober import Prober, RoundScheduler, TcpConnector
from hulk.wire.records import Peer, PeerSummary, ProbeKind, ProbeSettings

pytestmark = pytest.mark.root

FAST = ProbeSettings(interval_s=1.0, packets_per_round=4, timeout_s=0.5, payload_bytes=56,
                     max_concurrency=8)


def make_prober(settings=FAST, sink=lambda samples: None, icmp=True, packet_gap_s=0.02,
                **kwargs) -> Prober:
    mode = detect_icmp_mode()
    if icmp and mode is None:
        pytest.skip("no ICMP socket allowed here")
    return Prober(settings, sink, pinger=IcmpPinger(mode) if icmp else None,
                  rng=random.Random(1), packet_gap_s=packet_gap_s, **kwargs)


def test_icmp_mode_choice():
    assert choose_icmp_mode(0, [0], (1, 0)) == "raw"
    assert choose_icmp_mode(1000, [1000, 27], (0, 2147483647)) == "dgram"
    assert choose_icmp_mode(1000, [1000], (1, 0)) is None       # the kernel's "nobody" default
    assert choose_icmp_mode(1000, [1000], (2000, 3000)) is None
    assert choose_icmp_mode(1000, [1000, 2500], (2000, 3000)) == "dgram"


async def test_real_icmp_to_loopback_addresses():
    prober = make_prober()
    for address in ("127.0.0.1", "127.0.0.2"):
        before = time.time() * 1000
        samples = await prober.probe_round(Peer(f"peer-{address}", address))
        assert len(samples) == 4
        for sample in samples:
            assert sample.peer_id == f"peer-{address}"
            assert sample.kind is ProbeKind.ICMP and sample.payload_bytes == 56
            assert not sample.lost and 0 < sample.rtt_ms < 5.0
            assert sample.timeout_ms == 500.0
            assert before - 1 <= sample.sent_at_ms <= time.time() * 1000


async def test_icmp_across_a_namespace_and_loss_to_an_unused_address(lab_host):
    prober = make_prober()
    answered = await prober.probe_round(Peer("ns", lab_host.answering))
    assert [s.lost for s in answered] == [False] * 4 and max(s.rtt_ms for s in answered) < 5.0

    started = time.monotonic()
    lost = await prober.probe_round(Peer("nobody", lab_host.unused))
    elapsed = time.monotonic() - started
    assert [s.lost for s in lost] == [True] * 4
    assert all(s.rtt_ms == 0.0 and s.kind is ProbeKind.ICMP and s.payload_bytes == 56 for s in lost)
    assert elapsed < 4 * (0.5 + 0.02) + 1.0       # each packet waits at most its timeout

    unanswered = await TcpConnector().connect(lab_host.unused, 7411, 0.3)
    assert unanswered.rtt_ms is None              # a TCP probe nobody answers: lost


async def test_tcp_probe_when_no_icmp_socket():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]
        prober = make_prober(icmp=False)
        samples = await prober.probe_round(Peer("tcp-peer", "127.0.0.1", port))
    assert len(samples) == 4
    assert all(s.kind is ProbeKind.TCP and s.payload_bytes == 0 for s in samples)
    assert all(not s.lost and s.rtt_ms > 0 for s in samples)
    # Connect times are taken in user space: a busy CI box may stall one; the median is < 5 ms.
    assert sorted(s.rtt_ms for s in samples)[2] < 5.0


async def test_tcp_connect_outcomes():
    connector = TcpConnector()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]          # bound, not listening: the kernel answers RST
        refused = await connector.connect("127.0.0.1", port, 0.5)
    assert refused.rtt_ms is not None and refused.rtt_ms < 500   # answered, not lost


async def test_peer_without_icmp_or_probe_port_gives_no_samples():
    prober = make_prober(icmp=False)
    assert await prober.probe_round(Peer("mute", "127.0.0.1", 0)) == []


async def test_icmp_blocked_peer_falls_back_to_tcp(icmp_blocked_host):
    host, port = icmp_blocked_host
    prober = make_prober(icmp_recheck_rounds=2)
    peer = Peer("blocked", host.answering, port)
    first = await prober.probe_round(peer)
    kinds = [s.kind for s in first]
    assert kinds == [ProbeKind.ICMP] * 4 + [ProbeKind.TCP] * 4
    assert all(s.lost for s in first[:4]) and not any(s.lost for s in first[4:])
    assert sorted(s.rtt_ms for s in first[4:])[2] < 5.0   # median: a busy CI box may stall one
    # Known blocked now: TCP only, then ICMP is tried again after the recheck rounds.
    assert [s.kind for s in await prober.probe_round(peer)] == [ProbeKind.TCP] * 4
    assert [s.kind for s in await prober.probe_round(peer)] == [ProbeKind.TCP] * 4
    assert ProbeKind.ICMP in {s.kind for s in await prober.probe_round(peer)}


@pytest.mark.slow
async def test_running_prober_spreads_rounds_and_feeds_the_sink():
    received = []
    settings = ProbeSettings(interval_s=1.0, packets_per_round=2, timeout_s=0.5,
                             payload_bytes=56, max_concurrency=2)
    prober = make_prober(settings, sink=received.extend, packet_gap_s=0.01)
    peers = [Peer(f"lo{i}", f"127.0.0.{i}") for i in range(1, 6)]
    prober.set_peers(peers)
    task = asyncio.create_task(prober.run())
    await asyncio.sleep(2.6)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    # One summary per peer and round: 2-3 rounds of 2 packets in 2.6 s.
    per_peer = {p.node_id: [s for s in received if s.peer_id == p.node_id] for p in peers}
    for node_id, got in per_peer.items():
        assert 1 <= len(got) <= 3, (node_id, len(got))
        assert all(isinstance(s, PeerSummary) and s.count == 2 and s.lost == 0
                   and s.rtt_max_ms < 5.0 and sum(c for _, c in s.buckets) == 2 for s in got)
    first_sends = sorted(min(s.round_start_ms for s in got) for got in per_peer.values())
    assert first_sends[-1] - first_sends[0] > 100         # random phases, not one burst


def test_scheduler_phase_jitter_and_membership():
    scheduler = RoundScheduler(interval_s=60.0, rng=random.Random(7), jitter=0.1)
    peers = [Peer(str(i), f"127.0.1.{i}") for i in range(1, 101)]
    scheduler.set_peers(peers, now=0.0)
    rounds: dict[str, list[float]] = {p.node_id: [] for p in peers}
    t = 0.0
    while t < 300.0:
        for peer in scheduler.pop_due(t):
            rounds[peer.node_id].append(t)
        t += 0.5
    for times in rounds.values():
        assert len(times) in (4, 5, 6)                      # one round a minute for 5 minutes
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(47.5 <= g <= 72.5 for g in gaps)         # interval +- jitter (+ tick)
    first = sorted(times[0] for times in rounds.values())
    assert first[0] < 10 and first[-1] > 50                 # phases cover the interval
    # A peer list change keeps known peers' phases and forgets removed ones.
    due_before = scheduler.next_due()
    scheduler.set_peers(peers[:50] + [Peer("new", "127.0.2.1")], now=t)
    assert len(scheduler) == 51
    assert scheduler.next_due() >= due_before
    seen = set()
    for _ in range(200):
        t += 0.5
        seen |= {p.node_id for p in scheduler.pop_due(t)}
    assert "new" in seen and not seen & {str(i) for i in range(51, 101)}


def _checksum(data: bytes) -> int:
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF


def _icmp(kind: int, identifier: int, sequence: int, body: bytes = b"x" * 56) -> bytes:
    header = struct.pack("!BBHHH", kind, 0, 0, identifier, sequence)
    return struct.pack("!BBHHH", kind, 0, _checksum(header + body), identifier, sequence) + body


def _ipv4(payload: bytes) -> bytes:
    return bytes([0x45]) + bytes(19) + payload


def test_parse_icmp_replies_and_errors():
    reply = _icmp(0, 4242, 7)
    assert parse_icmp(_ipv4(reply), 4, has_ip_header=True) == (4242, 7, False)
    assert parse_icmp(reply, 4, has_ip_header=False) == (4242, 7, False)       # datagram socket
    unreachable = struct.pack("!BBHI", 3, 1, 0, 0) + _ipv4(_icmp(8, 4242, 9))
    assert parse_icmp(_ipv4(unreachable), 4, has_ip_header=True) == (4242, 9, True)
    assert parse_icmp(_ipv4(_icmp(8, 4242, 7)), 4, has_ip_header=True) is None  # a request
    assert parse_icmp(_icmp(129, 5, 6), 6, has_ip_header=False) == (5, 6, False)
    v6_unreachable = struct.pack("!BBHI", 1, 0, 0, 0) + bytes(40) + _icmp(128, 5, 8)
    assert parse_icmp(v6_unreachable, 6, has_ip_header=False) == (5, 8, True)
    assert parse_icmp(b"", 4, has_ip_header=True) is None
    assert parse_icmp(b"\x00\x00\x00", 4, has_ip_header=False) is None


async def test_many_concurrent_rounds_share_one_socket():
    mode = detect_icmp_mode()
    if mode is None:
        pytest.skip("no ICMP socket allowed here")
    pinger = IcmpPinger(mode)
    addresses = [f"127.0.1.{i}" for i in range(1, 61)]
    try:
        rounds = await asyncio.gather(*(pinger.ping(a, 3, 1.0, 56, 0.05) for a in addresses))
    finally:
        pinger.close()
    assert len(rounds) == 60
    for results in rounds:
        assert [r.rtt_ms is not None for r in results] == [True] * 3
        # Loopback answers in microseconds; the bound leaves room for a busy 2-core machine
        # (60 rounds at once), while a reply matched to the wrong probe would be far off.
        assert all(0 <= r.rtt_ms < 50.0 for r in results)


def test_unprivileged_icmp_datagram_sockets_in_a_namespace(lab_host, repo_dir):
    """ping_group_range is per network namespace: admit root's group in ours and ping over an
    unprivileged ICMP datagram socket there (the path non-root agents take)."""
    subprocess.run(["ip", "netns", "exec", lab_host.netns, "sysctl", "-qw",
                    "net.ipv4.ping_group_range=0 0"], check=True)
    script = (
        "import asyncio, json, os\n"
        "from agent.icmp import IcmpPinger, choose_icmp_mode, read_ping_group_range\n"
        "mode = choose_icmp_mode(1000, [0], read_ping_group_range())\n"
        "async def main():\n"
        "    pinger = IcmpPinger(mode)\n"
        "    results = await pinger.ping('127.0.0.1', 3, 1.0, 56, 0.05)\n"
        "    pinger.close()\n"
        "    return [r.rtt_ms for r in results]\n"
        "print(json.dumps({'mode': mode, 'rtts': asyncio.run(main())}))\n")
    result = subprocess.run(["ip", "netns", "exec", lab_host.netns, sys.executable, "-c", script],
                            cwd=repo_dir, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["mode"] == "dgram"
    assert len(report["rtts"]) == 3 and all(r is not None and 0 <= r < 5.0 for r in report["rtts"])
