"""The lab's switch: forward IP packets between hosts' TUN devices after each pair's one-way delay.

One process holds the TUN fd of every lab host (see :mod:`lab.netns`). It reads each packet a host
sends, finds the destination host by the IPv4 destination address, and writes the packet to that
host's TUN device ``one_way_s[src][dst]`` seconds after it was read, so a round trip between i and j
takes ``rtt[i][j]``. It is protocol-blind (ICMP, TCP and UDP are all just IP) and never reorders a
pair's packets (the release heap breaks ties by arrival order). Packets for an address that is not a
lab host, and anything that is not IPv4, are dropped and counted: lab traffic never leaves the lab.

Timing: the loop waits in ``select()``, whose timeout has microsecond resolution (epoll's is a
millisecond, which would add up to 1 ms per hop), for the earlier of "a packet arrived" and "the next
packet is due". The switch renices itself to -10 so that training processes that keep both cores
busy delay it little. Measured accuracy is in lab/README.md.

Run as ``python -m lab.switch --config FILE`` with the TUN fds inherited (``pass_fds``); the config
is JSON ``{"fds": [...], "addresses": [...], "one_way_s": [[...]], "stats": PATH}`` and optionally
``"early_s"`` (default ``DEFAULT_EARLY_S``) and ``"realtime"`` (default true). SIGTERM or
SIGINT stops it; SIGUSR1 (and exit) write the counters to ``stats``.

Rate: with ``"rate_mbps"`` (a matrix like ``one_way_s``; 0 or null = unlimited) a directed pair is a
link of that rate with a router's tail-drop buffer. A packet i -> j leaves the link at
``max(now, previous departure of i -> j) + size * 8 / rate`` and arrives the pair's one-way delay
later; a packet that would find more than ``"queue_bytes"`` (a number for every rated pair or a
matrix like ``rate_mbps``; default: ``DEFAULT_QUEUE_S`` of the rate, at least ``MIN_QUEUE_BYTES``)
already waiting for the link is dropped and counted.
"""

from __future__ import annotations

import argparse
import ctypes
import heapq
import json
import logging
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)

READ_SIZE = 65536
# Each hop costs about 0.1 ms of forwarding (kernel -> switch -> kernel, half the RTT to the
# zero-delay hub) and the switch wakes 0.05-0.1 ms after the time it asked for; releasing a packet
# this much before its due time cancels both on average (see lab/README.md for the measurement).
DEFAULT_EARLY_S = 0.00015
# Packets read from one host before the loop looks at the release heap again: bounds how long a
# burst from one host can hold up due packets.
BURST = 64
# A rated pair's buffer: this many seconds of its rate (a router buffer of about one WAN RTT lets
# a few TCP streams fill the link), never less than a few of the lab's 65 KB packets.
DEFAULT_QUEUE_S = 0.1
MIN_QUEUE_BYTES = 4 * 65536


@dataclass
class PairStats:
    packets: int = 0
    bytes: int = 0


@dataclass
class SwitchStats:
    forwarded: int = 0
    dropped_not_ipv4: int = 0
    dropped_unknown_dst: int = 0
    dropped_write_error: int = 0
    dropped_queue_full: int = 0
    late_sum_s: float = 0.0    # release time minus due time, summed over delayed packets
    late_max_s: float = 0.0
    delayed: int = 0
    pairs: dict[tuple[int, int], PairStats] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "forwarded": self.forwarded,
            "dropped_not_ipv4": self.dropped_not_ipv4,
            "dropped_unknown_dst": self.dropped_unknown_dst,
            "dropped_write_error": self.dropped_write_error,
            "dropped_queue_full": self.dropped_queue_full,
            "late_mean_ms": 1000.0 * self.late_sum_s / self.delayed if self.delayed else 0.0,
            "late_max_ms": 1000.0 * self.late_max_s,
            "pairs": {f"{s}->{d}": {"packets": p.packets, "bytes": p.bytes}
                      for (s, d), p in sorted(self.pairs.items())},
        }


class Switch:
    """Forwarder over ``fds[i]`` (host i's TUN, address ``addresses[i]``) with delays ``one_way_s``
    and, where ``rate_mbps[i][j]`` is positive, that pair's link rate (Mbit/s)."""

    def __init__(self, fds: list[int], addresses: list[str], one_way_s: list[list[float]],
                 early_s: float = DEFAULT_EARLY_S,
                 rate_mbps: list[list[float | None]] | None = None,
                 queue_bytes: float | list[list[float | None]] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 read: Callable[[int, int], bytes] = os.read,
                 write: Callable[[int, bytes], int] = os.write):
        n = len(fds)
        if len(addresses) != n or len(one_way_s) != n or any(len(r) != n for r in one_way_s):
            raise ValueError("fds, addresses and one_way_s must describe the same hosts")
        self.fds = list(fds)
        self.route = {socket.inet_aton(a): i for i, a in enumerate(addresses)}
        # What the switch holds each packet for: the configured delay less the hop's own cost.
        self.one_way_s = [list(map(float, row)) for row in one_way_s]
        self.hold_s = [[max(0.0, d - early_s) if d > 0 else 0.0 for d in row] for row in self.one_way_s]
        if rate_mbps is not None and (len(rate_mbps) != n or any(len(r) != n for r in rate_mbps)):
            raise ValueError("rate_mbps must be an n x n matrix over the same hosts")
        # Bytes per second of each rated pair (None: unlimited) and when its link is next free.
        self.rate_Bps = [[float(r) * 1e6 / 8 if r else None for r in row]
                         for row in (rate_mbps or [[None] * n for _ in range(n)])]
        if any(r is not None and r < 0 for row in self.rate_Bps for r in row):
            raise ValueError("rate_mbps must be positive (0 or null: unlimited)")
        if not isinstance(queue_bytes, list):
            queue_bytes = [[queue_bytes] * n for _ in range(n)]
        elif len(queue_bytes) != n or any(len(r) != n for r in queue_bytes):
            raise ValueError("queue_bytes must be a number or an n x n matrix over the same hosts")
        self.queue_bytes = [[0.0 if r is None else float(q) if q else
                             max(MIN_QUEUE_BYTES, r * DEFAULT_QUEUE_S)
                             for r, q in zip(rates, queues)]
                            for rates, queues in zip(self.rate_Bps, queue_bytes)]
        self.free_at = [[0.0] * n for _ in range(n)]
        self.index = {fd: i for i, fd in enumerate(self.fds)}
        self.clock, self._read, self._write = clock, read, write
        self.heap: list[tuple[float, int, int, bytes]] = []
        self._seq = 0
        self.stats = SwitchStats()
        self.dead: set[int] = set()

    def receive(self, src: int, packet: bytes, now: float) -> None:
        """Route one packet read from host ``src`` at ``now``: write it now or queue it."""
        if len(packet) < 20 or packet[0] >> 4 != 4:
            self.stats.dropped_not_ipv4 += 1
            return
        dst = self.route.get(packet[16:20])
        if dst is None:
            self.stats.dropped_unknown_dst += 1
            return
        rate = self.rate_Bps[src][dst]
        if rate is not None:
            start = max(now, self.free_at[src][dst])
            if (start - now) * rate > self.queue_bytes[src][dst]:
                self.stats.dropped_queue_full += 1
                return
            self.free_at[src][dst] = start + len(packet) / rate
        pair = self.stats.pairs.setdefault((src, dst), PairStats())
        pair.packets += 1
        pair.bytes += len(packet)
        delay = self.hold_s[src][dst]
        if rate is not None:
            # On the wire until its last byte leaves, then the path's delay.
            delay = self.free_at[src][dst] - now + delay
        if delay <= 0:
            self._deliver(dst, packet)
            return
        heapq.heappush(self.heap, (now + delay, self._seq, dst, packet))
        self._seq += 1

    def release_due(self, now: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= now:
            due, _, dst, packet = heapq.heappop(heap)
            late = now - due
            self.stats.delayed += 1
            self.stats.late_sum_s += late
            if late > self.stats.late_max_s:
                self.stats.late_max_s = late
            self._deliver(dst, packet)

    def _deliver(self, dst: int, packet: bytes) -> None:
        try:
            self._write(self.fds[dst], packet)
            self.stats.forwarded += 1
        except OSError:
            # The destination's device is down or gone (its namespace is being torn down).
            self.stats.dropped_write_error += 1

    def timeout(self, now: float) -> float | None:
        return max(0.0, self.heap[0][0] - now) if self.heap else None

    def drain(self, fd: int) -> None:
        src = self.index[fd]
        for _ in range(BURST):
            try:
                packet = self._read(fd, READ_SIZE)
            except BlockingIOError:
                return
            except OSError as err:
                # The device is gone (its namespace was deleted under us): stop watching it, or
                # select() would report it readable forever and spin at real-time priority.
                log.warning("host %d's device failed (%s); no longer reading it", src, err)
                self.dead.add(fd)
                return
            if not packet:
                self.dead.add(fd)
                return
            self.receive(src, packet, self.clock())

    def serve(self, stop_fd: int, on_wake: Callable[[bytes], bool] | None = None) -> None:
        """Forward until ``stop_fd`` is readable and ``on_wake`` (given what was read) says stop."""
        while True:
            watch = [fd for fd in self.fds if fd not in self.dead] + [stop_fd]
            readable, _, _ = select.select(watch, [], [], self.timeout(self.clock()))
            for fd in readable:
                if fd == stop_fd:
                    data = os.read(stop_fd, 64)
                    if on_wake is None or on_wake(data):
                        return
                else:
                    self.drain(fd)
            self.release_due(self.clock())


def _prctl_setup() -> None:
    """Ask the kernel to SIGTERM us when the lab process dies (so a crash frees the TUN devices),
    and to wake us on time: the default 50 us timer slack would add to every hop."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        libc.prctl(29, 1000)           # PR_SET_TIMERSLACK, in ns
    except (OSError, AttributeError):
        pass


def _raise_priority(realtime: bool) -> None:
    """Run ahead of the training processes: a packet due now must not wait for a time slice.

    SCHED_RR at the lowest real-time priority when allowed (the loop sleeps in select() whenever
    nothing is due, and the kernel's RT throttling keeps 5% of each core for others even if a flood
    kept it busy); otherwise nice -10.
    """
    if realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
            return
        except (OSError, AttributeError):
            pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.switch")
    parser.add_argument("--config", required=True, help="JSON: fds, addresses, one_way_s, stats")
    parser.add_argument("--parent", type=int, default=0, help="exit if this pid is not our parent")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="switch: %(message)s")
    _prctl_setup()
    if args.parent and os.getppid() != args.parent:
        return 1  # the parent died before we could ask to follow it
    with open(args.config) as fh:
        cfg = json.load(fh)
    _raise_priority(cfg.get("realtime", True))
    switch = Switch(cfg["fds"], cfg["addresses"], cfg["one_way_s"],
                    early_s=float(cfg.get("early_s", DEFAULT_EARLY_S)),
                    rate_mbps=cfg.get("rate_mbps"), queue_bytes=cfg.get("queue_bytes"))
    stats_path = cfg.get("stats")

    def write_stats() -> None:
        if stats_path:
            tmp = stats_path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(switch.stats.as_dict(), fh)
            os.replace(tmp, stats_path)

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, lambda *_: None)

    def on_wake(data: bytes) -> bool:
        write_stats()
        return any(b in (signal.SIGTERM, signal.SIGINT) for b in data)

    print("ready", flush=True)
    try:
        switch.serve(wake_r, on_wake)
    finally:
        write_stats()
    return 0


if __name__ == "__main__":
    sys.exit(main())
