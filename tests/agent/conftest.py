"""Fixtures for the agent's tests: network namespaces the tests create and remove themselves."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class LabHost:
    """A namespace behind a veth pair: ``answering`` is its address, ``unused`` answers nothing."""

    netns: str
    answering: str
    unused: str


def _make_host(tag: str, prefix: str) -> LabHost:
    """198.18.0.0/15 is the benchmarking range (RFC 2544): never a real host's address."""
    pid = os.getpid()
    netns, outer, inner = f"hulk-agent-test-{pid}-{tag}", f"hk{tag}{pid % 100000}", "eth0"
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    _ip("netns", "add", netns)
    try:
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", netns)
        _ip("addr", "add", f"{prefix}.1/24", "dev", outer)
        _ip("link", "set", outer, "up")
        _ip("-n", netns, "addr", "add", f"{prefix}.2/24", "dev", inner)
        _ip("-n", netns, "link", "set", inner, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        raise
    return LabHost(netns, f"{prefix}.2", f"{prefix}.9")


def _need_root() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (network namespaces, raw ICMP)")


@pytest.fixture(scope="module")
def lab_host():
    """A namespace that answers ICMP on .2; .9 of its subnet is unused (no reply, ever)."""
    _need_root()
    host = _make_host("a", f"198.18.{os.getpid() % 250}")
    yield host
    subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)


@pytest.fixture(scope="module")
def icmp_blocked_host():
    """A namespace that ignores ICMP echo but has a TCP listener: (host, port)."""
    _need_root()
    host = _make_host("b", f"198.19.{os.getpid() % 250}")
    subprocess.run(["ip", "netns", "exec", host.netns, "sysctl", "-qw",
                    "net.ipv4.icmp_echo_ignore_all=1"], check=True)
    port = 7411
    listener = subprocess.Popen(
        ["ip", "netns", "exec", host.netns, sys.executable, "-c",
         "import socket, time\n"
         "s = socket.socket(); s.bind(('0.0.0.0', %d)); s.listen(128)\n"
         "print('listening', flush=True)\n"
         "while True:\n    c, _ = s.accept(); c.close()\n" % port],
        stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "listening"
        yield host, port
    finally:
        listener.kill()
        listener.wait()
        subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        time.sleep(0.05)
