"""The switch's forwarding rules, driven with a fake clock and fake devices (no namespaces)."""

from __future__ import annotations

from lab.switch import Switch
from tests.helpers.switch import Wire, ipv4


def make(delays, early_s=0.0):
    wire = Wire()
    addrs = ["10.77.0.10", "10.77.0.11", "10.77.0.1"]
    sw = Switch([100, 101, 102], addrs, delays, early_s=early_s, clock=lambda: wire.now,
                write=wire.write)
    return sw, wire, addrs


def test_each_packet_waits_its_pairs_one_way_delay():
    sw, wire, a = make([[0, 0.020, 0], [0.030, 0, 0], [0, 0, 0]])
    sw.receive(0, ipv4(a[0], a[1], b"ab"), now=1.0)
    sw.receive(1, ipv4(a[1], a[0], b"ba"), now=1.0)
    assert sw.timeout(1.0) == 0.020 or abs(sw.timeout(1.0) - 0.020) < 1e-12
    wire.now = 1.0199
    sw.release_due(wire.now)
    assert wire.sent == []
    wire.now = 1.020
    sw.release_due(wire.now)
    assert [(fd, p[-2:]) for fd, p, _ in wire.sent] == [(101, b"ab")]
    wire.now = 1.031
    sw.release_due(wire.now)
    assert [(fd, p[-2:]) for fd, p, _ in wire.sent] == [(101, b"ab"), (100, b"ba")]
    assert sw.stats.late_max_s > 0.0009  # the second packet was released 1 ms late


def test_zero_delay_goes_out_at_once_and_order_is_kept():
    sw, wire, a = make([[0, 0.010, 0], [0.010, 0, 0], [0, 0, 0]])
    sw.receive(0, ipv4(a[0], a[2], b"h1"), now=0.0)       # to the hub: no delay
    assert [p[-2:] for _, p, _ in wire.sent] == [b"h1"]
    for k in range(5):                                    # same due time: arrival order wins
        sw.receive(0, ipv4(a[0], a[1], bytes([k])), now=0.0)
    wire.now = 0.010
    sw.release_due(wire.now)
    assert [p[-1] for _, p, _ in wire.sent[1:]] == [0, 1, 2, 3, 4]


def test_unknown_destinations_and_non_ipv4_are_dropped():
    sw, wire, a = make([[0, 0.01, 0], [0.01, 0, 0], [0, 0, 0]])
    sw.receive(0, ipv4(a[0], "8.8.8.8"), now=0.0)
    sw.receive(0, b"\x60" + bytes(39), now=0.0)          # an IPv6 header
    sw.receive(0, b"\x45\x00", now=0.0)                   # truncated
    sw.release_due(10.0)
    assert wire.sent == []
    assert sw.stats.dropped_unknown_dst == 1 and sw.stats.dropped_not_ipv4 == 2


def test_early_release_compensates_the_hop_cost():
    sw, wire, a = make([[0, 0.010, 0], [0.010, 0, 0], [0, 0, 0]], early_s=0.0002)
    sw.receive(0, ipv4(a[0], a[1]), now=0.0)
    assert abs(sw.timeout(0.0) - 0.0098) < 1e-12


def test_a_device_that_fails_is_no_longer_read():
    def broken_read(fd, size):
        raise OSError(77, "File descriptor in bad state")

    sw = Switch([100, 101], ["10.77.0.10", "10.77.0.11"], [[0, 0.01], [0.01, 0]], read=broken_read,
                write=lambda fd, p: len(p))
    sw.drain(100)
    assert sw.dead == {100}
