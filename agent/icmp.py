"""ICMP echo for the prober: which socket kind this process may open, and the pinger.

Sockets are raw when root, else the kernel's unprivileged ICMP datagram sockets when
net.ipv4.ping_group_range admits one of our groups; with neither, the agent probes over TCP only.
One socket per address family serves every round; replies carry kernel receive timestamps (see
IcmpPinger).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import random
import socket
import struct
import time
from collections.abc import Iterable
from pathlib import Path

from agent.prober import IcmpUnavailableError, PacketResult

log = logging.getLogger(__name__)

PING_GROUP_RANGE = Path("/proc/sys/net/ipv4/ping_group_range")


# ---------------------------------------------------------------- choosing the ICMP socket kind

def read_ping_group_range(path: Path = PING_GROUP_RANGE) -> tuple[int, int] | None:
    try:
        low, high = path.read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def choose_icmp_mode(euid: int, groups: Iterable[int],
                     ping_group_range: tuple[int, int] | None) -> str | None:
    """"raw" for root, "dgram" when the kernel lets one of our groups open ICMP datagram
    sockets, None when neither (then TCP probes only)."""
    if euid == 0:
        return "raw"
    if ping_group_range is not None:
        low, high = ping_group_range
        if any(low <= gid <= high for gid in groups):
            return "dgram"
    return None


def detect_icmp_mode() -> str | None:
    groups = {os.getegid(), *os.getgroups()}
    return choose_icmp_mode(os.geteuid(), groups, read_ping_group_range())


# ---------------------------------------------------------------------------------- the pinger

class _Round:
    """One ping() call in flight: its packets' results, filled in by sends, replies, timeouts."""

    __slots__ = ("address", "family", "timeout_s", "payload", "results", "open", "future")

    def __init__(self, address: str, family: int, count: int, timeout_s: float, payload: bytes,
                 future: asyncio.Future):
        self.address, self.family, self.timeout_s = address, family, timeout_s
        self.payload, self.future = payload, future
        self.results: list[PacketResult | None] = [None] * count
        self.open = count                  # packets without a result yet

    def settle(self, index: int, result: PacketResult) -> None:
        if self.results[index] is None:
            self.results[index] = result
            self.open -= 1
            if self.open == 0 and not self.future.done():
                self.future.set_result(self.results)


# Linux values; Python's socket module does not export them.
SOL_RAW, ICMP_FILTER = 255, 1
SO_TIMESTAMPNS = SCM_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@ll")
ECHO_REPLY = {4: 0, 6: 129}
ECHO_REQUEST = {4: 8, 6: 128}
ERROR_TYPES = {4: (3, 11), 6: (1, 3)}        # destination unreachable, time exceeded


def parse_icmp(data: bytes, family: int, has_ip_header: bool) -> tuple[int, int, bool] | None:
    """(identifier, sequence, is_error) of an echo reply, or of the echo request quoted in an
    ICMP error; None for anything else. Raw IPv4 sockets deliver the IP header, others do not."""
    if has_ip_header:
        if not data:
            return None
        data = data[(data[0] & 0x0F) * 4:]
    if len(data) < 8:
        return None
    kind = data[0]
    if kind == ECHO_REPLY[family]:
        identifier, sequence = struct.unpack_from("!HH", data, 4)
        return identifier, sequence, False
    if kind in ERROR_TYPES[family]:
        inner = data[8:]
        offset = ((inner[0] & 0x0F) * 4 if inner else 0) if family == 4 else 40
        quoted = inner[offset:]
        if len(quoted) >= 8 and quoted[0] == ECHO_REQUEST[family]:
            identifier, sequence = struct.unpack_from("!HH", quoted, 4)
            return identifier, sequence, True
    return None


class IcmpPinger:
    """ICMP echo: icmplib opens the sockets and builds and sends the requests; replies are read
    with kernel receive timestamps (SO_TIMESTAMPNS).

    Cost matters (hundreds of peers on a GPU server, target under 1% of a core): one socket per
    address family and one pacing tick that reads every reply waiting, expires timeouts and
    sends the rounds' next packets, instead of a socket, timers and a wake-up per packet.
    Because the kernel stamps each reply on arrival, reading it up to a tick later does not
    change the RTT (and icmplib's ~0.5 ms of user-space timing on loopback goes away too).
    """

    def __init__(self, mode: str, tick_s: float = 0.2):
        if mode not in ("raw", "dgram"):
            raise ValueError(f"ICMP mode must be 'raw' or 'dgram', not {mode!r}")
        self.mode = mode
        self.tick_s = tick_s
        self._identifier = random.randrange(1, 0xFFFF)   # raw mode; the kernel picks for dgram
        self._sequences = itertools.count(random.randrange(0, 0xFFFF))
        self._sockets: dict[int, tuple[object, bool]] = {}   # family -> (icmplib socket, stamps)
        self._waiting: dict[tuple[int, int], tuple[_Round, int, float]] = {}
        self._sends: list[tuple[float, int, _Round, int]] = []       # (when, tie, round, index)
        self._deadlines: list[tuple[float, tuple[int, int]]] = []    # (when, key)
        self._tie = itertools.count()
        self._tick: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._payloads: dict[int, bytes] = {}
        self._ready_at: dict[int, float] = {}   # family -> when its timestamps can be trusted

    # The kernel turns receive timestamps on for the whole host lazily (a deferred work item the
    # first time a socket asks): replies in the first moments may carry the read time instead.
    TIMESTAMP_SETTLE_S = 0.25

    def open(self) -> None:
        """Open the IPv4 socket now (at start-up), so its timestamps are on before probing."""
        try:
            self._socket(4)
        except IcmpUnavailableError as err:
            log.warning("%s", err)

    def _socket(self, family: int):
        entry = self._sockets.get(family)
        if entry is not None:
            return entry[0]
        from icmplib import ICMPv4Socket, ICMPv6Socket
        from icmplib.exceptions import ICMPLibError

        try:
            sock = (ICMPv6Socket if family == 6 else ICMPv4Socket)(privileged=self.mode == "raw")
        except (ICMPLibError, OSError) as err:
            raise IcmpUnavailableError(f"cannot open an ICMP socket ({self.mode}): {err}") from None
        sock.blocking = False
        if family == 4 and self.mode == "raw":
            # Only echo replies and errors wake us, not our own requests on loopback.
            mask = ~sum(1 << t for t in (0, *ERROR_TYPES[4])) & 0xFFFFFFFF
            try:
                sock.sock.setsockopt(SOL_RAW, ICMP_FILTER, struct.pack("I", mask))
            except OSError:
                pass
        try:
            sock.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            stamps = True
        except OSError:
            stamps = False
            log.warning("no kernel receive timestamps: RTTs include up to %.0f ms of tick",
                        self.tick_s * 1000)
        self._loop = asyncio.get_running_loop()
        self._sockets[family] = (sock, stamps)
        self._ready_at[family] = self._loop.time() + self.TIMESTAMP_SETTLE_S
        return sock

    def _payload(self, size: int) -> bytes:
        # icmplib draws a fresh random payload per packet unless given one; one per size will do.
        if size not in self._payloads:
            self._payloads[size] = bytes(random.getrandbits(8) for _ in range(size))
        return self._payloads[size]

    async def ping(self, address: str, count: int, timeout_s: float, payload_bytes: int,
                   gap_s: float) -> list[PacketResult]:
        family = 6 if ":" in address else 4
        self._socket(family)
        loop = asyncio.get_running_loop()
        if (settle := self._ready_at[family] - loop.time()) > 0:
            await asyncio.sleep(settle)
        round_ = _Round(address, family, count, timeout_s, self._payload(payload_bytes),
                        loop.create_future())
        now = loop.time()
        for index in range(1, count):
            heapq.heappush(self._sends, (now + index * gap_s, next(self._tie), round_, index))
        try:
            self._send(round_, 0)
            self._arm()
            return await round_.future  # type: ignore[return-value]
        finally:
            if not round_.future.done():  # cancelled: forget its packets
                round_.future.cancel()
                for key in [k for k, v in self._waiting.items() if v[0] is round_]:
                    del self._waiting[key]

    def _send(self, round_: _Round, index: int) -> None:
        from icmplib import ICMPRequest
        from icmplib.exceptions import ICMPSocketError, SocketPermissionError

        if round_.future.done():
            return
        sock = self._sockets[round_.family][0]
        sequence = next(self._sequences) & 0xFFFF
        request = ICMPRequest(destination=round_.address, id=self._identifier,
                              sequence=sequence, payload=round_.payload)
        try:
            sock.send(request)
        except (SocketPermissionError, ICMPSocketError) as err:
            if isinstance(err, SocketPermissionError) or _is_forbidden(err):
                round_.future.set_exception(IcmpUnavailableError(f"cannot send ICMP: {err}"))
            else:  # no route and such: lost
                round_.settle(index, PacketResult(time.time(), None))
            return
        key = (round_.family, sequence)
        self._waiting[key] = (round_, index, request.time)
        assert self._loop is not None
        heapq.heappush(self._deadlines, (self._loop.time() + round_.timeout_s, key))

    def _drain(self) -> None:
        """Read every reply waiting on the sockets and settle the packets they answer."""
        space = socket.CMSG_SPACE(_TIMESPEC.size)
        for family, (sock, stamps) in self._sockets.items():
            raw_socket = sock.sock
            has_ip_header = family == 4 and self.mode == "raw"
            while True:
                try:
                    data, ancillary, _, _ = raw_socket.recvmsg(1024, space if stamps else 0)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as err:
                    log.debug("ICMP receive failed: %s", err)
                    break
                received_at = time.time()
                for level, kind, value in ancillary:
                    if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS:
                        seconds, nanoseconds = _TIMESPEC.unpack_from(value)
                        received_at = seconds + nanoseconds / 1e9
                parsed = parse_icmp(data, family, has_ip_header)
                if parsed is None:
                    continue
                identifier, sequence, is_error = parsed
                if self.mode == "raw" and identifier != self._identifier:
                    continue  # another program's ping (the kernel filters these for dgram)
                entry = self._waiting.pop((family, sequence), None)
                if entry is None:
                    continue  # already timed out
                round_, index, sent_at = entry
                rtt_ms = (received_at - sent_at) * 1000
                lost = is_error or rtt_ms > round_.timeout_s * 1000
                round_.settle(index, PacketResult(sent_at, None if lost else rtt_ms))

    def _arm(self) -> None:
        if self._tick is None and (self._sends or self._waiting) and self._loop is not None:
            self._tick = self._loop.call_later(self.tick_s, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        assert self._loop is not None
        try:
            self._drain()
            now = self._loop.time()
            while self._deadlines and self._deadlines[0][0] <= now:
                _, key = heapq.heappop(self._deadlines)
                entry = self._waiting.pop(key, None)
                if entry is not None:
                    round_, index, sent_at = entry
                    round_.settle(index, PacketResult(sent_at, None))
            if not self._waiting:
                self._deadlines.clear()  # only answered packets' entries are left
            while self._sends and self._sends[0][0] <= now + self.tick_s / 2:
                _, _, round_, index = heapq.heappop(self._sends)
                self._send(round_, index)
        except Exception:  # the tick must keep going, whatever one packet did
            log.exception("ICMP tick failed")
        finally:
            self._arm()

    def close(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        for sock, _ in self._sockets.values():
            sock.close()
        self._sockets.clear()
        for round_, _, _ in self._waiting.values():
            if not round_.future.done():
                round_.future.cancel()
        self._waiting.clear()
        self._sends.clear()
        self._deadlines.clear()


def _is_forbidden(err: Exception) -> bool:
    text = str(err)
    return "Operation not permitted" in text or "Permission denied" in text
