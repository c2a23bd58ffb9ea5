"""The WAN lab with real namespaces, TUN devices, the switch process and real ICMP/TCP/UDP."""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import textwrap
import time

import pytest

from lab import matrix as lm
from lab import netns
from lab.wan import REPO

pytestmark = [pytest.mark.root, pytest.mark.process]


def tolerance_ms(configured: float) -> float:
    return max(1.0, 0.05 * configured)


def test_switch_reproduces_the_rtt_matrix_for_icmp(wan_lab, ping_available):
    hosts = wan_lab.hosts
    pairs = [(a, b) for i, a in enumerate(hosts) for b in hosts[i + 1:]] + [(hosts[0], "hub")]
    # All pairs at once: the switch must keep every pair's delay while others are in flight.
    procs = {pair: wan_lab.popen(pair[0], ["ping", "-n", "-c", "8", "-i", "0.05", "-W", "3",
                                           wan_lab.address(pair[1])],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for pair in pairs}
    errors = {}
    for pair, proc in procs.items():
        out, _ = proc.communicate(timeout=30)
        rtts = [float(t) for t in re.findall(r"time=([0-9.]+) ms", out)]
        assert len(rtts) >= 6, f"{pair}: lost echoes\n{out}"
        configured = wan_lab.configured_rtt_ms(*pair)
        errors[pair] = statistics.median(rtts) - configured
        assert abs(errors[pair]) <= tolerance_ms(configured), (
            f"{pair}: configured {configured:.2f} ms, measured median {statistics.median(rtts):.2f} ms")
    # Every pair really was delayed (not just a fast path that happens to be within 1 ms).
    far = max(pairs[:-1], key=lambda p: wan_lab.configured_rtt_ms(*p))
    assert wan_lab.configured_rtt_ms(*far) > 50 and errors[far] > -tolerance_ms(50)
    stats = wan_lab.switch_stats()
    assert stats["forwarded"] >= 2 * 6 * len(pairs)


ECHO_SERVER = textwrap.dedent("""
    import socket, sys
    t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(("0.0.0.0", 7000)); t.listen()
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 7000))
    print("ready", flush=True)
    for _ in range(5):
        data, peer = u.recvfrom(100); u.sendto(data, peer)
    for _ in range(5):
        c, _ = t.accept(); c.sendall(c.recv(100)); c.close()
""")

ECHO_CLIENT = textwrap.dedent("""
    import socket, sys, time, json
    addr = sys.argv[1]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(5)
    udp, connect = [], []
    for _ in range(5):
        t0 = time.perf_counter(); u.sendto(b"udp", (addr, 7000)); data = u.recv(100)
        udp.append((time.perf_counter() - t0) * 1000)
    for _ in range(5):
        t0 = time.perf_counter(); c = socket.create_connection((addr, 7000), timeout=5)
        connect.append((time.perf_counter() - t0) * 1000)
        c.sendall(b"tcp"); back = c.recv(100); c.close()
    # The fastest of five: a round trip cannot be shorter than the path, and the minimum is the
    # one least disturbed by whatever else runs on the machine.
    print(json.dumps({"udp_ms": min(udp), "connect_ms": min(connect), "udp": data.decode(),
                      "tcp": back.decode()}))
""")


def test_tcp_and_udp_cross_the_switch_with_the_pairs_delay(wan_lab):
    import json

    a, b = wan_lab.hosts[0], wan_lab.hosts[2]  # Beijing, Tokyo
    server = wan_lab.popen(b, [sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        out = wan_lab.run(a, [sys.executable, "-c", ECHO_CLIENT, wan_lab.address(b)], timeout=30)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
    finally:
        server.wait(timeout=10)
    rtt = wan_lab.configured_rtt_ms(a, b)
    assert got["udp"] == "udp" and got["tcp"] == "tcp"
    # One round trip each (datagram and reply; SYN and SYN-ACK), plus Python's own overhead.
    # The lower bound is what matters: it fails when the switch did not hold the packets.
    assert rtt - 1.0 <= got["udp_ms"] <= rtt + max(5.0, 0.1 * rtt)
    assert rtt - 1.0 <= got["connect_ms"] <= rtt + max(5.0, 0.1 * rtt)


def test_traffic_for_outside_addresses_is_dropped_by_the_switch(wan_lab, ping_available):
    before = wan_lab.switch_stats()["dropped_unknown_dst"]
    # 192.0.2.1 is TEST-NET-1: documentation only. It goes to the switch, which must drop it.
    out = wan_lab.run(wan_lab.hosts[0], ["ping", "-n", "-c", "2", "-i", "0.1", "-W", "1", "192.0.2.1"])
    assert out.returncode != 0
    assert wan_lab.switch_stats()["dropped_unknown_dst"] >= before + 2


def _lab_namespaces(prefix: str) -> list[str]:
    return [n for n in netns.list_namespaces() if n.startswith(prefix)]


def test_stop_leaves_no_namespace_tun_or_etc_behind(make_wan_lab):
    lab = make_wan_lab(lm.from_cities(["Beijing", "Tokyo"]))
    prefix = lab.namespaces.prefix
    assert len(_lab_namespaces(prefix)) == 3  # two hosts and the hub
    sleeper = lab.popen(lab.hosts[0], ["sleep", "600"])
    switch_pid = lab.switch_proc.pid
    lab.stop()
    assert _lab_namespaces(prefix) == []
    assert not list(netns.ETC_NETNS.glob(prefix + "*"))
    assert sleeper.wait(timeout=5) != 0  # processes inside were stopped
    assert not os.path.exists(f"/proc/{switch_pid}/stat") or open(f"/proc/{switch_pid}/stat").read().split()[2] == "Z"
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"t{os.getpid():x}." not in links


CRASHING_LAB = textwrap.dedent("""
    import time
    from lab import matrix
    from lab.wan import WanLab
    lab = WanLab(matrix.from_cities(["Paris", "Rome"])).start()
    print(lab.namespaces.prefix, lab.switch_proc.pid, flush=True)
    time.sleep(600)
""")


def test_a_crashed_lab_is_cleaned_up_by_the_next_one(lab_available):
    child = subprocess.Popen([sys.executable, "-c", CRASHING_LAB], stdout=subprocess.PIPE, text=True,
                             cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    prefix, switch_pid = child.stdout.readline().split()
    assert len(_lab_namespaces(prefix)) == 3
    child.send_signal(signal.SIGKILL)  # no teardown at all
    child.wait()
    # The switch follows its parent (PR_SET_PDEATHSIG), which frees the TUN devices.
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{switch_pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{switch_pid}")
    removed = netns.cleanup_stale()
    assert set(_lab_namespaces(prefix)) == set()
    assert sum(1 for n in removed if n.startswith(prefix)) == 3
    assert not list(netns.ETC_NETNS.glob(prefix + "*"))
