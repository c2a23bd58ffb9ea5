"""A rated pair in the switch (serialisation queue, tail drop) and the CPU-group plumbing, with a
fake clock, fake devices and a fake cgroup folder (no namespaces)."""

from __future__ import annotations

import pytest

from lab import netns
from lab.switch import MIN_QUEUE_BYTES, Switch
from tests.helpers.switch import Wire, ipv4

A = ["10.77.0.10", "10.77.0.11", "10.77.0.1"]


def make(delays, rate_mbps=None, queue_bytes=None):
    wire = Wire()
    sw = Switch([100, 101, 102], A, delays, early_s=0.0, clock=lambda: wire.now,
                write=wire.write, rate_mbps=rate_mbps, queue_bytes=queue_bytes)
    return sw, wire


def release_all(sw, wire, until: float, step: float = 1e-4) -> None:
    while wire.now < until:
        wire.now += step
        sw.release_due(wire.now)


def test_a_rated_pair_spaces_packets_by_their_size_then_adds_the_delay():
    # 8 Mbit/s = 1e6 bytes/s: a 1000-byte packet takes 1 ms on the wire.
    rates = [[0, 8, 0], [0, 0, 0], [0, 0, 0]]
    sw, wire = make([[0, 0.010, 0], [0.010, 0, 0], [0, 0, 0]], rates)
    for k in range(3):
        sw.receive(0, ipv4(A[0], A[1], bytes([k]) * (1000 - 20)), now=0.0)
    release_all(sw, wire, 0.05)
    times = [t for _, _, t in wire.sent]
    assert [p[-1] for _, p, _ in wire.sent] == [0, 1, 2]
    assert times == pytest.approx([0.011, 0.012, 0.013], abs=2e-4)
    # The reverse direction has no rate: delay only.
    wire.sent.clear()
    sw.receive(1, ipv4(A[1], A[0], b"r"), now=wire.now)
    start = wire.now
    release_all(sw, wire, start + 0.02)
    assert wire.sent[0][2] - start == pytest.approx(0.010, abs=2e-4)


def test_an_idle_link_does_not_bank_credit():
    sw, wire = make([[0, 0, 0], [0, 0, 0], [0, 0, 0]], [[0, 8, 0], [0, 0, 0], [0, 0, 0]])
    sw.receive(0, ipv4(A[0], A[1], b"x" * 980), now=0.0)
    release_all(sw, wire, 1.0, step=1e-3)
    wire.sent.clear()
    sw.receive(0, ipv4(A[0], A[1], b"y" * 980), now=1.0)
    release_all(sw, wire, 1.01)
    assert wire.sent[0][2] == pytest.approx(1.001, abs=2e-4)


def test_a_full_buffer_drops_and_counts():
    # 1000 bytes of buffer at 1e6 bytes/s: the second packet waits 1 ms (1000 bytes queued, kept),
    # the third would wait 2 ms (2000 bytes ahead of it) and is dropped.
    sw, wire = make([[0, 0, 0], [0, 0, 0], [0, 0, 0]], [[0, 8, 0], [0, 0, 0], [0, 0, 0]],
                    queue_bytes=1000)
    for k in range(3):
        sw.receive(0, ipv4(A[0], A[1], bytes([k]) * 980), now=0.0)
    release_all(sw, wire, 0.01)
    assert [p[-1] for _, p, _ in wire.sent] == [0, 1]
    assert sw.stats.dropped_queue_full == 1
    assert sw.stats.as_dict()["dropped_queue_full"] == 1


def test_throughput_of_a_saturated_pair_is_its_rate():
    rate_mbps = 80.0  # 1e7 bytes/s
    sw, wire = make([[0, 0.005, 0], [0, 0, 0], [0, 0, 0]], [[0, rate_mbps, 0], [0, 0, 0], [0, 0, 0]])
    size = 65000
    sent = 0
    while wire.now < 0.5:          # a sender that keeps the buffer full
        sw.receive(0, ipv4(A[0], A[1], b"z" * (size - 20)), now=wire.now)
        sent += 1
        wire.now += 0.001
        sw.release_due(wire.now)
    delivered = sum(len(p) for _, p, t in wire.sent if 0.1 <= t < 0.5)
    assert delivered / 0.4 == pytest.approx(rate_mbps * 1e6 / 8, rel=0.1)
    assert sw.stats.dropped_queue_full > 0 and sent > len(wire.sent)


def test_default_buffer_and_bad_rates():
    sw, _ = make([[0, 0, 0]] * 3, [[0, 1, 0], [0, 0, 0], [0, 0, 0]])
    assert sw.queue_bytes[0][1] == MIN_QUEUE_BYTES and sw.rate_Bps[1][0] is None
    with pytest.raises(ValueError, match="n x n"):
        make([[0, 0, 0]] * 3, [[0, 1], [0, 0]])
    with pytest.raises(ValueError, match="positive"):
        make([[0, 0, 0]] * 3, [[0, -1, 0], [0, 0, 0], [0, 0, 0]])


def test_cpu_cgroup_root_is_found_for_either_mount_layout(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
                      "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n")
    assert str(netns.cpu_cgroup_root(mounts)) == "/sys/fs/cgroup/cpu,cpuacct"
    mounts.write_text("cgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\n"
                      "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    assert netns.cpu_cgroup_root(mounts) is None


def test_cpu_group_writes_period_and_quota_and_wraps_the_command(tmp_path):
    group = netns.CpuGroup(tmp_path / "hulk-lab-1-0-a", 0.25).create()
    assert (group.path / "cpu.cfs_period_us").read_text() == str(netns.CFS_PERIOD_US)
    assert (group.path / "cpu.cfs_quota_us").read_text() == str(netns.CFS_PERIOD_US // 4)
    argv = group.wrap(["ip", "netns", "exec", "ns", "python", "x.py"])
    assert argv[:3] == ["sh", "-c", 'echo $$ > "$0" && exec "$@"']
    assert argv[3] == str(group.path / "cgroup.procs") and argv[4:] == ["ip", "netns", "exec", "ns",
                                                                       "python", "x.py"]
    with pytest.raises(netns.LabError, match=f"{netns.MIN_CORES:g} to 1024"):
        netns.CpuGroup(tmp_path / "g2", netns.MIN_CORES / 2).create()


def test_namespaces_refuse_a_quota_for_an_unknown_host():
    with pytest.raises(netns.LabError, match="not in the lab: ghost"):
        netns.Namespaces(["a", "b"], cpu_cores={"ghost": 0.5})


def test_a_queue_matrix_sizes_each_rated_pair_and_zero_keeps_the_default():
    rates = [[0, 8, 0], [8, 0, 0], [0, 0, 0]]
    sw, wire = make([[0, 0, 0]] * 3, rates, queue_bytes=[[0, 3000, 0], [0, 0, 0], [0, 0, 0]])
    assert sw.queue_bytes[0][1] == 3000 and sw.queue_bytes[1][0] == MIN_QUEUE_BYTES
    # 8 Mbit/s: 1 ms per 1000-byte packet; the fourth of a burst finds 3 ms (3000 bytes) waiting.
    for _ in range(6):
        sw.receive(0, ipv4(A[0], A[1], b"z" * 980), now=0.0)
    assert sw.stats.dropped_queue_full == 2
    with pytest.raises(ValueError, match="queue_bytes"):
        make([[0, 0, 0]] * 3, rates, queue_bytes=[[0, 1], [0, 0]])
