"""RTT probes to the peers: ICMP echo (64-byte message) with a TCP-connect fallback.

- Rounds: one per peer per interval, each peer at its own random phase, each round jittered, so
  a fleet's probes do not arrive in bursts.
- A round sends several packets, one after the other with a small gap; every packet becomes a
  sample, a lost one with lost=True (never an exception).
- ICMP sockets: raw when root, else the kernel's unprivileged ICMP datagram sockets when
  net.ipv4.ping_group_range admits our group; with neither, TCP only. One socket per address
  family serves every round; replies carry kernel receive timestamps (see IcmpPinger).
- Where ICMP gets no answer at all (or cannot be sent) and the peer lists a probe port, a TCP
  connect round measures instead; a peer found ICMP-blocked is probed over TCP and re-tried
  over ICMP every ``icmp_recheck_rounds`` rounds.
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.clock import Clock, SystemClock
from agent.records import Peer, ProbeKind, ProbeSample

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


# ------------------------------------------------------------------------------ the transports

@dataclass(frozen=True)
class PacketResult:
    sent_at: float             # unix epoch seconds
    rtt_ms: float | None       # None: lost


class IcmpUnavailableError(Exception):
    """ICMP cannot be used for this round (no socket, or sending is forbidden)."""


class Pinger(Protocol):
    async def ping(self, address: str, count: int, timeout_s: float, payload_bytes: int,
                   gap_s: float) -> list[PacketResult]: ...


class Connector(Protocol):
    async def connect(self, address: str, port: int, timeout_s: float) -> PacketResult: ...


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


class TcpConnector:
    """Times a TCP handshake: SYN out, SYN-ACK (or RST: the host answered too) back."""

    async def connect(self, address: str, port: int, timeout_s: float) -> PacketResult:
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sent_at = time.time()
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)
            started = time.perf_counter()
            try:
                await asyncio.wait_for(loop.sock_connect(sock, (address, port)), timeout_s)
            except ConnectionRefusedError:
                pass  # an RST is an answer from the peer's kernel
            except (asyncio.TimeoutError, OSError):
                return PacketResult(sent_at, None)
            rtt_ms = (time.perf_counter() - started) * 1000
        return PacketResult(sent_at, rtt_ms if rtt_ms <= timeout_s * 1000 else None)


# ------------------------------------------------------------------------------- the schedule

class RoundScheduler:
    """When each peer's next round is due: a random phase per peer, jitter per round.

    Pure: times are plain floats of a monotonic clock; randomness comes from ``rng``.
    """

    def __init__(self, interval_s: float, rng: random.Random, jitter: float = 0.1):
        self.interval_s = interval_s
        self.jitter = jitter
        self._rng = rng
        self._nominal: dict[str, float] = {}     # peer -> nominal time of its next round
        self._peers: dict[str, Peer] = {}
        self._heap: list[tuple[float, str, int]] = []
        self._generation = itertools.count()
        self._current: dict[str, int] = {}       # peer -> generation of its live heap entry

    def set_peers(self, peers: Iterable[Peer], now: float) -> None:
        """Keep the phase of known peers, give new ones a random phase, forget the rest."""
        peers = {p.node_id: p for p in peers}
        for gone in set(self._peers) - set(peers):
            del self._peers[gone], self._nominal[gone], self._current[gone]
        for node_id, peer in peers.items():
            if node_id not in self._peers:
                self._push(node_id, now + self._rng.uniform(0, self.interval_s))
            self._peers[node_id] = peer

    def set_interval(self, interval_s: float, now: float) -> None:
        if interval_s == self.interval_s:
            return
        self.interval_s = interval_s
        for node_id in list(self._peers):  # re-phase within the new interval
            self._push(node_id, now + self._rng.uniform(0, interval_s))

    def _push(self, node_id: str, nominal: float) -> None:
        self._nominal[node_id] = nominal
        offset = self._rng.uniform(-self.jitter, self.jitter) * self.interval_s
        generation = next(self._generation)
        self._current[node_id] = generation
        heapq.heappush(self._heap, (nominal + offset, node_id, generation))

    def _drop_stale(self) -> None:
        while self._heap and self._current.get(self._heap[0][1]) != self._heap[0][2]:
            heapq.heappop(self._heap)

    def next_due(self) -> float | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[Peer]:
        due: list[Peer] = []
        while (when := self.next_due()) is not None and when <= now:
            _, node_id, _ = heapq.heappop(self._heap)
            due.append(self._peers[node_id])
            nominal = self._nominal[node_id] + self.interval_s
            while nominal + self.interval_s <= now:  # fell behind: skip missed rounds, no burst
                nominal += self.interval_s
            self._push(node_id, nominal)
        return due

    def __len__(self) -> int:
        return len(self._peers)


# --------------------------------------------------------------------------------- the prober

@dataclass(frozen=True)
class ProbeParams:
    interval_s: float = 60.0
    packets_per_round: int = 5
    timeout_s: float = 2.0
    payload_bytes: int = 56
    max_concurrency: int = 64
    packet_gap_s: float = 0.2      # between the packets of one round


SampleSink = Callable[[Sequence[ProbeSample]], None]


class Prober:
    """Runs the rounds; hands each round's samples to ``sink`` (the spool)."""

    def __init__(self, params: ProbeParams, sink: SampleSink, *, pinger: Pinger | None,
                 connector: Connector | None = None, clock: Clock | None = None,
                 rng: random.Random | None = None, icmp_recheck_rounds: int = 10,
                 batch_window_s: float = 0.5):
        self.params = params
        self._sink = sink
        self._pinger = pinger
        self._connector = connector or TcpConnector()
        self._clock = clock or SystemClock()
        self._scheduler = RoundScheduler(params.interval_s, rng or random.Random())
        self._semaphore = asyncio.Semaphore(params.max_concurrency)
        self._in_flight: dict[str, asyncio.Task] = {}
        self._icmp_blocked: dict[str, int] = {}  # peer -> TCP rounds left before re-trying ICMP
        self._icmp_recheck_rounds = icmp_recheck_rounds
        self.batch_window_s = batch_window_s
        self._wake = asyncio.Event()
        self._warned: set[str] = set()
        self.rounds_done = 0

    # -- configuration, safe to call while running
    def set_peers(self, peers: Iterable[Peer]) -> None:
        self._scheduler.set_peers(peers, self._clock.monotonic())
        self._wake.set()

    def set_params(self, params: ProbeParams) -> None:
        if params.max_concurrency != self.params.max_concurrency:
            self._semaphore = asyncio.Semaphore(params.max_concurrency)
        self._scheduler.set_interval(params.interval_s, self._clock.monotonic())
        self.params = params
        self._wake.set()

    @property
    def peer_count(self) -> int:
        return len(self._scheduler)

    # -- the loop
    async def run(self) -> None:
        try:
            while True:
                now = self._clock.monotonic()
                for peer in self._scheduler.pop_due(now):
                    if peer.node_id in self._in_flight:
                        log.debug("round to %s still running; skipping one", peer.node_id)
                        continue
                    task = asyncio.create_task(self._round(peer), name=f"probe {peer.node_id}")
                    self._in_flight[peer.node_id] = task
                    task.add_done_callback(lambda _t, p=peer.node_id: self._in_flight.pop(p, None))
                due = self._scheduler.next_due()
                # Rounds due within the next half second start together: fewer wake-ups, and
                # a phase shifted by < 0.5 s does not matter at a 60 s interval.
                wait = 1.0 if due is None else max(self.batch_window_s,
                                                   due - self._clock.monotonic())
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=min(wait, 5.0))
                except asyncio.TimeoutError:
                    pass
        finally:
            for task in list(self._in_flight.values()):
                task.cancel()
            if self._in_flight:
                await asyncio.gather(*self._in_flight.values(), return_exceptions=True)

    async def _round(self, peer: Peer) -> None:
        try:
            async with self._semaphore:
                samples = await self.probe_round(peer)
            if samples:
                self._sink(samples)
            self.rounds_done += 1
        except asyncio.CancelledError:
            raise
        except Exception:  # a periodic job: log and go on
            log.exception("probe round to %s failed", peer.node_id)

    async def probe_round(self, peer: Peer) -> list[ProbeSample]:
        """One round to one peer: ICMP, or TCP where ICMP is unavailable or blocked."""
        p = self.params
        blocked_left = self._icmp_blocked.get(peer.node_id, 0)
        if self._pinger is not None and (blocked_left == 0 or not peer.probe_port):
            try:
                results = await self._pinger.ping(peer.address, p.packets_per_round, p.timeout_s,
                                                  p.payload_bytes, p.packet_gap_s)
            except IcmpUnavailableError as err:
                self._warn_once(f"icmp:{err}", "ICMP unavailable (%s); using TCP probes", err)
                results = None
            samples = [] if results is None else self._samples(peer, results, ProbeKind.ICMP,
                                                               p.payload_bytes)
            icmp_answered = any(r.rtt_ms is not None for r in results or ())
            if icmp_answered or not peer.probe_port:
                self._icmp_blocked.pop(peer.node_id, None)
                if results is None:
                    self._warn_once(f"none:{peer.node_id}", "cannot probe %s: ICMP unavailable "
                                    "and the peer has no probe port", peer.node_id)
                return samples
            tcp = await self._tcp_round(peer)
            if any(not s.lost for s in tcp):
                log.info("peer %s answers TCP but not ICMP; probing it over TCP", peer.node_id)
                self._icmp_blocked[peer.node_id] = self._icmp_recheck_rounds
            return samples + tcp
        if not peer.probe_port:
            self._warn_once(f"none:{peer.node_id}", "cannot probe %s: no ICMP socket and the "
                            "peer has no probe port", peer.node_id)
            return []
        if blocked_left:
            self._icmp_blocked[peer.node_id] = blocked_left - 1
        return await self._tcp_round(peer)

    async def _tcp_round(self, peer: Peer) -> list[ProbeSample]:
        p = self.params
        results = []
        for index in range(p.packets_per_round):
            if index:
                await asyncio.sleep(p.packet_gap_s)
            results.append(await self._connector.connect(peer.address, peer.probe_port,
                                                         p.timeout_s))
        return self._samples(peer, results, ProbeKind.TCP, 0)

    def _samples(self, peer: Peer, results: Sequence[PacketResult], kind: ProbeKind,
                 payload_bytes: int) -> list[ProbeSample]:
        timeout_ms = self.params.timeout_s * 1000
        return [ProbeSample(peer_id=peer.node_id, sent_at_ms=int(r.sent_at * 1000), kind=kind,
                            payload_bytes=payload_bytes,
                            lost=r.rtt_ms is None or r.rtt_ms > timeout_ms,
                            rtt_ms=0.0 if r.rtt_ms is None or r.rtt_ms > timeout_ms else r.rtt_ms,
                            timeout_ms=timeout_ms)
                for r in results]

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)


class ProbeListener:
    """The TCP port peers connect-probe us on: accept and close at once."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
            writer.close()

        self._server = await asyncio.start_server(close_at_once, self.host or None, self.port)
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
