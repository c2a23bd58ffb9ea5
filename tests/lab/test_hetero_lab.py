"""The heterogeneous lab for real: a host's CPU quota (cgroup v1) and a rated link in the switch.

The bands are wide on purpose: they separate "limited" from "not limited" on a shared 2-core
machine, not measure the limits precisely (bench/throughput_bench.py does that)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from lab import matrix as lm
from lab import netns
from lab.wan import REPO

pytestmark = [pytest.mark.root, pytest.mark.process]

SPIN = textwrap.dedent("""
    import sys, time
    end = time.monotonic() + float(sys.argv[1]); n = 0
    while time.monotonic() < end:
        for _ in range(1000): pass
        n += 1
    print(n)
""")


def _cgroup_or_skip():
    root = netns.cpu_cgroup_root()
    if root is None or not root.is_dir():
        pytest.skip("no cgroup v1 cpu controller")
    return root


def test_a_host_with_a_quarter_core_spins_at_a_quarter_speed(make_wan_lab):
    root = _cgroup_or_skip()
    lab = make_wan_lab(lm.from_cities(["Paris", "Rome"]), cpu_cores={"paris-1": 0.25})
    group = lab.namespaces.cpu_groups["paris-1"]
    assert group.path.parent == root
    assert (group.path / "cpu.cfs_quota_us").read_text().strip() == str(netns.CFS_PERIOD_US // 4)
    # Both at once, so whatever else runs on the machine slows both alike.
    slow = lab.popen("paris-1", [sys.executable, "-c", SPIN, "2.0"], stdout=subprocess.PIPE, text=True)
    fast = lab.popen("rome-1", [sys.executable, "-c", SPIN, "2.0"], stdout=subprocess.PIPE, text=True)
    ratio = int(slow.communicate(timeout=30)[0]) / int(fast.communicate(timeout=30)[0])
    assert 0.15 <= ratio <= 0.4, ratio
    stat = dict(line.split() for line in (group.path / "cpu.stat").read_text().splitlines())
    assert int(stat["nr_throttled"]) > 0  # the quota, not chance, held the spinner back
    lab.stop()
    assert not group.path.exists()


SINK = textwrap.dedent("""
    import socket, time, json
    s = socket.socket(); s.bind(("0.0.0.0", 7100)); s.listen(4)
    print("ready", flush=True)
    for _ in range(2):
        c, peer = s.accept(); total = 0; first = None
        while True:
            data = c.recv(1 << 20)
            if not data: break
            if first is None: first = time.monotonic()
            total += len(data)
        print(json.dumps({"peer": peer[0], "bytes": total, "s": time.monotonic() - first}), flush=True)
        c.close()
""")
SOURCE = textwrap.dedent("""
    import socket, sys
    c = socket.create_connection((sys.argv[1], 7100), timeout=30)
    c.sendall(b"x" * int(sys.argv[2])); c.close()
""")


def test_a_rated_pair_carries_about_its_rate_and_an_unrated_one_far_more(make_wan_lab):
    rate = 20.0  # Mbit/s, paris-1 -> rome-1 only
    lab = make_wan_lab(lm.from_cities(["Paris", "Rome", "Berlin"]).scaled(0.1),
                       rate_mbps={("paris-1", "rome-1"): rate})
    sink = lab.popen("rome-1", [sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout.readline().strip() == "ready"
        nbytes = 4_000_000  # 1.6 s at 20 Mbit/s
        got = {}
        for host in ("paris-1", "berlin-1"):
            out = lab.run(host, [sys.executable, "-c", SOURCE, lab.address("rome-1"), str(nbytes)],
                          timeout=60)
            assert out.returncode == 0, out.stderr
            line = json.loads(sink.stdout.readline())
            assert line["bytes"] == nbytes
            got[host] = line["bytes"] * 8 / line["s"] / 1e6
    finally:
        sink.kill()
        sink.wait()
    assert 0.6 * rate <= got["paris-1"] <= 1.15 * rate, got
    assert got["berlin-1"] >= 4 * got["paris-1"], got
    stats = lab.switch_stats()
    assert stats["pairs"]["0->1"]["bytes"] >= nbytes


CRASHING_LAB = textwrap.dedent("""
    import time
    from lab import matrix
    from lab.wan import WanLab
    lab = WanLab(matrix.from_cities(["Paris"]), cpu_cores={"paris-1": 0.5}).start()
    lab.popen("paris-1", ["sleep", "600"])
    print(lab.namespaces.cpu_groups["paris-1"].path, flush=True)
    time.sleep(600)
""")


def test_a_crashed_labs_cpu_group_is_removed_by_the_cleanup(lab_available):
    _cgroup_or_skip()
    child = subprocess.Popen([sys.executable, "-c", CRASHING_LAB], stdout=subprocess.PIPE, text=True,
                             cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    path = child.stdout.readline().strip()
    assert os.path.isdir(path)
    deadline = time.monotonic() + 5
    while not netns.cpu_group_pids(netns.Path(path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert netns.cpu_group_pids(netns.Path(path))  # the sleeper joined the group
    child.send_signal(signal.SIGKILL)
    child.wait()
    removed = netns.cleanup_stale()
    assert os.path.basename(path) in removed
    assert not os.path.exists(path)
