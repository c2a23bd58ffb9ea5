"""sd_notify to a real unix datagram socket bound by the test (path and abstract namespace)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from agent.systemd import SystemdNotifier


@pytest.fixture
def notify_socket(tmp_path: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(2.0)
    yield str(path), sock
    sock.close()


def test_ready_watchdog_status_stopping(notify_socket):
    path, sock = notify_socket
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"})
    assert notifier.enabled and notifier.watchdog_interval_s == 2.0
    assert notifier.ready("waiting for the planner")
    assert sock.recv(4096) == b"READY=1\nSTATUS=waiting for the planner"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.status("probing 3 peers")
    assert sock.recv(4096) == b"STATUS=probing 3 peers"
    assert notifier.stopping()
    assert sock.recv(4096) == b"STOPPING=1"
    notifier.close()


def test_abstract_namespace_socket():
    name = f"hulk-agent-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2.0)
        notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": "@" + name})
        assert notifier.ready()
        assert sock.recv(4096) == b"READY=1"
        notifier.close()


def test_not_under_systemd_is_a_no_op():
    notifier = SystemdNotifier.from_environ({})
    assert not notifier.enabled
    assert notifier.watchdog_interval_s is None
    assert notifier.ready() is False and notifier.watchdog() is False


def test_watchdog_for_another_pid_is_ignored(tmp_path):
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": str(tmp_path / "x"),
                                             "WATCHDOG_USEC": "1000000",
                                             "WATCHDOG_PID": str(os.getpid() + 1)})
    assert notifier.watchdog_interval_s is None


def test_missing_socket_does_not_raise(tmp_path):
    notifier = SystemdNotifier(str(tmp_path / "gone"))
    assert notifier.ready() is False
