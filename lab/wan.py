"""A running WAN lab: the namespaces of :mod:`lab.netns` joined by a :mod:`lab.switch` process.

    with WanLab(matrix) as lab:
        lab.run("beijing-1", ["ping", "-c", "3", lab.address("tokyo-1")])

With ``hub=True`` (the default) there is one more host, ``hub`` at ``10.77.0.1``, with zero delay
to every other host: the planner and the broker run there, so agents reach them over the lab
network exactly as they reach each other, and the root namespace needs no route into the lab.

All optional: ``rate_mbps`` {(src, dst): Mbit/s} makes those directed pairs links of that rate
(the switch's serialisation queue); ``path_mtu`` {(src, dst): bytes} gives those directed pairs a
smaller MTU than the lab's (a route to the destination with that ``mtu``, so TCP sends segments
of a real WAN's size where the lab's 65 KB packets would make a slow link's queue hold a handful
of packets; a rated pair's queue is then sized for that MTU); ``cpu_cores`` {host: cores} holds
every process the lab starts in a host to that many cores (a cgroup v1 ``cpu`` quota). The hub is
never limited.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from lab.matrix import LatencyMatrix
from lab.netns import DEVICE, DEFAULT_MTU, HUB_ADDRESS, LabError, Namespace, Namespaces
from lab.switch import DEFAULT_QUEUE_S

REPO = Path(__file__).resolve().parents[1]
HUB = "hub"
MIN_PATH_MTU = 576          # the smallest MTU every IPv4 host must accept
QUEUE_PACKETS = 4           # a rated pair's queue holds at least this many of its largest packets

_PING_TIME = re.compile(r"time[=<]([0-9.]+) ms")


class WanLab:
    def __init__(self, matrix: LatencyMatrix, *, hub: bool = True, mtu: int = DEFAULT_MTU,
                 work_dir: Path | None = None, python: str = sys.executable,
                 rate_mbps: Mapping[tuple[str, str], float] | None = None,
                 cpu_cores: Mapping[str, float] | None = None,
                 path_mtu: Mapping[tuple[str, str], int] | None = None):
        if hub and HUB in matrix.names:
            raise LabError(f"a lab host may not be called {HUB!r} (the planner's host)")
        self.matrix = matrix
        self.hub = hub
        self.python = python
        self.rate_mbps = dict(rate_mbps or {})
        for (a, b), rate in self.rate_mbps.items():
            if a not in matrix.names or b not in matrix.names or a == b:
                raise LabError(f"rate for {a!r} -> {b!r}: both must be distinct lab hosts")
            if not rate > 0:
                raise LabError(f"rate for {a!r} -> {b!r} must be a positive Mbit/s, got {rate!r}")
        self.path_mtu = dict(path_mtu or {})
        for (a, b), size in self.path_mtu.items():
            if a not in matrix.names or b not in matrix.names or a == b:
                raise LabError(f"path MTU for {a!r} -> {b!r}: both must be distinct lab hosts")
            if not (isinstance(size, int) and MIN_PATH_MTU <= size <= mtu):
                raise LabError(f"path MTU for {a!r} -> {b!r} must be an integer from "
                               f"{MIN_PATH_MTU} to the lab's {mtu}, got {size!r}")
        self.mtu = mtu
        self.namespaces = Namespaces(matrix.names, hub=hub, mtu=mtu, cpu_cores=dict(cpu_cores or {}))
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="hulk-lab-"))
        self.switch_proc: subprocess.Popen | None = None
        self._stats_path = self.work_dir / "switch-stats.json"

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "WanLab":
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.namespaces.create()
        try:
            for (a, b), size in self.path_mtu.items():
                self.namespaces.runner(["ip", "-n", self.ns(a).netns, "route", "add",
                                        f"{self.address(b)}/32", "dev", DEVICE, "mtu", str(size)])
            self._start_switch()
        except BaseException:
            self.stop()
            raise
        return self

    def _one_way_s(self) -> list[list[float]]:
        n = self.matrix.n
        size = n + (1 if self.hub else 0)
        table = [[0.0] * size for _ in range(size)]
        for i in range(n):
            for j in range(n):
                table[i][j] = self.matrix.one_way_s(i, j)
        return table  # hub row/column stay 0: the planner is "everywhere"

    def _rate_table(self) -> list[list[float]] | None:
        if not self.rate_mbps:
            return None
        names = self.matrix.names
        size = len(names) + (1 if self.hub else 0)
        table = [[0.0] * size for _ in range(size)]  # 0: unlimited (the hub's row and column too)
        for (a, b), rate in self.rate_mbps.items():
            table[names.index(a)][names.index(b)] = float(rate)
        return table

    def _queue_table(self) -> list[list[float]] | None:
        """Each rated pair's queue in bytes (0: the switch's default): where the pair has a path
        MTU, ``DEFAULT_QUEUE_S`` of its rate and at least ``QUEUE_PACKETS`` packets of that MTU."""
        if not (self.rate_mbps and self.path_mtu):
            return None
        names = self.matrix.names
        size = len(names) + (1 if self.hub else 0)
        table = [[0.0] * size for _ in range(size)]
        for (a, b), rate in self.rate_mbps.items():
            if (a, b) in self.path_mtu:
                table[names.index(a)][names.index(b)] = max(
                    QUEUE_PACKETS * self.path_mtu[(a, b)], rate * 1e6 / 8 * DEFAULT_QUEUE_S)
        return table

    def _start_switch(self) -> None:
        fds = [m.fd for m in self.namespaces.members]
        cfg = {"fds": fds, "addresses": [m.address for m in self.namespaces.members],
               "one_way_s": self._one_way_s(), "stats": str(self._stats_path)}
        if self.rate_mbps:
            cfg["rate_mbps"] = self._rate_table()
            cfg["queue_bytes"] = self._queue_table()
        cfg_path = self.work_dir / "switch.json"
        cfg_path.write_text(json.dumps(cfg))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        for fd in fds:
            os.set_inheritable(fd, True)
        self.switch_proc = subprocess.Popen(
            [self.python, "-m", "lab.switch", "--config", str(cfg_path), "--parent", str(os.getpid())],
            pass_fds=fds, stdout=subprocess.PIPE, stderr=open(self.work_dir / "switch.log", "wb"),
            env=env, cwd=str(REPO))
        line = self.switch_proc.stdout.readline() if self.switch_proc.stdout else b""
        if line.strip() != b"ready":
            raise LabError(f"the switch did not start; see {self.work_dir / 'switch.log'}")
        # The switch holds the only copies now: when it exits, the TUN devices go with it.
        self.namespaces.close_fds()

    def stop(self) -> None:
        proc, self.switch_proc = self.switch_proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.namespaces.destroy()
        if self._own_dir:
            for p in sorted(self.work_dir.glob("*")):
                if p.is_file():
                    p.unlink()
            try:
                self.work_dir.rmdir()
            except OSError:
                pass

    def __enter__(self) -> "WanLab":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- hosts ---------------------------------------------------------------------------------
    @property
    def hosts(self) -> list[str]:
        return list(self.matrix.names)

    def ns(self, host: str) -> Namespace:
        return self.namespaces.by_host(host)

    def address(self, host: str) -> str:
        return HUB_ADDRESS if host == HUB and self.hub else self.ns(host).address

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        return self.namespaces.exec_argv(host, argv)

    def popen(self, host: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.exec_argv(host, argv), **kwargs)

    def run(self, host: str, argv: Sequence[str], timeout: float | None = 60,
            **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.exec_argv(host, argv), timeout=timeout, **kwargs)

    def configured_rtt_ms(self, a: str, b: str) -> float:
        if HUB in (a, b):
            return 0.0
        names = self.matrix.names
        return self.matrix.rtt(names.index(a), names.index(b))

    def ping_ms(self, src: str, dst: str, count: int = 5, interval_s: float = 0.2,
                size: int = 56) -> list[float]:
        """RTTs (ms) of ``count`` real ICMP echoes from ``src`` to ``dst``, as ``ping`` reports them."""
        deadline = count * interval_s + 2 * self.configured_rtt_ms(src, dst) / 1000 + 5
        proc = self.run(src, ["ping", "-n", "-c", str(count), "-i", str(interval_s), "-s", str(size),
                              "-W", "3", self.address(dst)], timeout=deadline)
        return [float(m) for m in _PING_TIME.findall(proc.stdout)]

    def switch_stats(self, timeout_s: float = 2.0) -> dict:
        """The switch's counters (forwarded, dropped, lateness, per pair)."""
        if self.switch_proc is None:
            raise LabError("the lab is not running")
        before = self._stats_path.stat().st_mtime_ns if self._stats_path.exists() else 0
        self.switch_proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._stats_path.exists() and self._stats_path.stat().st_mtime_ns != before:
                return json.loads(self._stats_path.read_text())
            time.sleep(0.02)
        raise LabError("the switch did not report its counters")
