"""A lab pair's path MTU: a real route MTU in the sender's namespace (the kernel refuses a larger
unfragmented packet, TCP sends segments that fit) and a rated pair's queue sized for it."""

from __future__ import annotations

import pytest

from lab import matrix as lm
from lab.netns import LabError
from lab.switch import DEFAULT_QUEUE_S, MIN_QUEUE_BYTES
from lab.wan import QUEUE_PACKETS, WanLab


def two_hosts() -> lm.LatencyMatrix:
    return lm.LatencyMatrix((lm.Host("a", None), lm.Host("b", None)), ((0.0, 20.0), (20.0, 0.0)))


def test_bad_path_mtus_are_refused_before_anything_is_built():
    for pairs, words in (({("a", "c"): 1500}, "distinct lab hosts"),
                         ({("a", "a"): 1500}, "distinct lab hosts"),
                         ({("a", "b"): 100}, "from 576"),
                         ({("a", "b"): 70000}, "from 576"),
                         ({("a", "b"): 1500.0}, "integer")):
        with pytest.raises(LabError, match=words):
            WanLab(two_hosts(), hub=False, path_mtu=pairs)


def test_a_rated_pair_with_a_path_mtu_gets_a_queue_of_its_packets():
    lab = WanLab(two_hosts(), hub=False, rate_mbps={("a", "b"): 4.0, ("b", "a"): 4.0},
                 path_mtu={("a", "b"): 1500})
    table = lab._queue_table()
    # a -> b: a tenth of a second at 4 Mbit/s (50 kB), more than 4 packets of 1500 bytes;
    # b -> a keeps the switch's default (0 asks for it), sized for the lab's 65 kB packets.
    assert table[0][1] == pytest.approx(max(QUEUE_PACKETS * 1500, 4e6 / 8 * DEFAULT_QUEUE_S))
    assert table[1][0] == 0.0
    small = WanLab(two_hosts(), hub=False, rate_mbps={("a", "b"): 0.1},
                   path_mtu={("a", "b"): 1500})._queue_table()
    assert small[0][1] == QUEUE_PACKETS * 1500 < MIN_QUEUE_BYTES
    assert WanLab(two_hosts(), hub=False, path_mtu={("a", "b"): 1500})._queue_table() is None


@pytest.mark.root
@pytest.mark.process
def test_the_path_mtu_holds_one_direction_only(make_wan_lab, ping_available):
    lab = make_wan_lab(two_hosts(), hub=False, path_mtu={("a", "b"): 1500})

    def df_ping(src: str, dst: str, size: int) -> int:
        # -M do: do not fragment; a packet over the route's MTU fails at the sender.
        return lab.run(src, ["ping", "-n", "-c", "1", "-W", "2", "-M", "do", "-s", str(size),
                             lab.address(dst)], timeout=10).returncode

    assert df_ping("a", "b", 1400) == 0
    assert df_ping("a", "b", 3000) != 0
    assert df_ping("b", "a", 3000) == 0
    route = lab.run("a", ["ip", "route", "get", lab.address("b")]).stdout
    assert "mtu 1500" in route
