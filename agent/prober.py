"""RTT probes to the peers: ICMP echo (64-byte message, agent.icmp) with a TCP-connect fallback.

- Rounds: one per peer per interval, each peer at its own random phase, each round jittered, so
  a fleet's probes do not arrive in bursts.
- A round sends several packets, one after the other with a small gap; every packet becomes a
  sample, a lost one with lost=True (never an exception). The sink gets the round folded into
  one ``PeerSummary`` per peer and probe kind (count, lost, sums, min, max, histogram), not the
  samples (``summarize=False`` hands on the raw samples, the older wire form).
- Where ICMP gets no answer at all (or cannot be sent) and the peer lists a probe port, a TCP
  connect round measures instead; a peer found ICMP-blocked is probed over TCP and re-tried
  over ICMP every ``icmp_recheck_rounds`` rounds.
- Peers come from the planner: one the agent cannot probe (agent.peers.peer_problem) is skipped
  with one warning; a host name is resolved off the event loop (agent.peers.PeerResolver), so
  a name that does not resolve delays only its own rounds.
- While ``paused()`` is true (this node sends or receives a throughput test, whose bytes fill
  the path and queue the probes behind them) a due round is skipped, and a round that finds
  the pause begun when it ends is dropped whole: a summary is of a whole round, and every
  round counts once, in ``rounds_done`` or in ``rounds_paused``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from agent.clock import Clock, SystemClock
from agent.peers import PeerResolver, peer_problem
from hulk.wire.records import Peer, PeerSummary, ProbeKind, ProbeSample, ProbeSettings

log = logging.getLogger(__name__)


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
                async with asyncio.timeout(timeout_s):
                    await loop.sock_connect(sock, (address, port))
            except ConnectionRefusedError:
                pass  # an RST is an answer from the peer's kernel
            except (TimeoutError, OSError):
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

SampleSink = Callable[[Sequence[ProbeSample | PeerSummary]], None]


def summarize_round(samples: Sequence[ProbeSample]) -> list[PeerSummary]:
    """A round's samples folded into one summary per (peer, probe kind), in first-seen order
    (a round that fell back from ICMP to TCP gives two)."""
    groups: dict[tuple[str, int], list[ProbeSample]] = {}
    for s in samples:
        groups.setdefault((s.peer_id, int(s.kind)), []).append(s)
    return [PeerSummary.of_samples(group) for group in groups.values()]


class Prober:
    """Runs the rounds as ``settings`` say; hands each round's samples to ``sink`` (the spool).
    The packets of a round are ``packet_gap_s`` apart."""

    def __init__(self, settings: ProbeSettings, sink: SampleSink, *, pinger: Pinger | None,
                 connector: Connector | None = None, clock: Clock | None = None,
                 rng: random.Random | None = None, icmp_recheck_rounds: int = 10,
                 batch_window_s: float = 0.5, packet_gap_s: float = 0.2,
                 resolver: PeerResolver | None = None, summarize: bool = True,
                 paused: Callable[[], bool] = lambda: False):
        self.settings = settings
        self._paused = paused
        self.summarize = summarize
        self.packet_gap_s = packet_gap_s
        self._sink = sink
        self._pinger = pinger
        self._connector = connector or TcpConnector()
        self._resolver = resolver or PeerResolver()
        self._clock = clock or SystemClock()
        self._scheduler = RoundScheduler(settings.interval_s, rng or random.Random())
        self._semaphore = asyncio.Semaphore(settings.max_concurrency)
        self._in_flight: dict[str, asyncio.Task] = {}
        self._icmp_blocked: dict[str, int] = {}  # peer -> TCP rounds left before re-trying ICMP
        self._icmp_recheck_rounds = icmp_recheck_rounds
        self.batch_window_s = batch_window_s
        self._wake = asyncio.Event()
        self._warned: set[str] = set()
        self.rounds_done = 0
        self.rounds_paused = 0   # skipped or dropped while paused

    # -- configuration, safe to call while running
    def set_peers(self, peers: Iterable[Peer]) -> None:
        """Probe these peers from now on; one the agent cannot probe is skipped (one warning
        per peer and problem, however often the planner names it)."""
        usable = []
        for peer in peers:
            problem = peer_problem(peer)
            if problem is None:
                usable.append(peer)
            else:
                self._warn_once(f"bad:{peer.node_id}:{problem}", "skipping peer %r from the "
                                "planner: %s", peer.node_id[:64], problem)
        self._scheduler.set_peers(usable, self._clock.monotonic())
        self._wake.set()

    def set_settings(self, settings: ProbeSettings) -> None:
        if settings.max_concurrency != self.settings.max_concurrency:
            self._semaphore = asyncio.Semaphore(settings.max_concurrency)
        self._scheduler.set_interval(settings.interval_s, self._clock.monotonic())
        self.settings = settings
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
                try:  # asyncio.timeout: wait_for may swallow a cancel (see Reporter._linger)
                    async with asyncio.timeout(min(wait, 5.0)):
                        await self._wake.wait()
                except TimeoutError:
                    pass
        finally:
            for task in list(self._in_flight.values()):
                task.cancel()
            if self._in_flight:
                await asyncio.gather(*self._in_flight.values(), return_exceptions=True)

    async def _round(self, peer: Peer) -> None:
        try:
            async with self._semaphore:
                if self._paused():
                    self.rounds_paused += 1
                    return
                samples = await self.probe_round(peer)
            if self._paused():   # the pause began during the round: its last packets queued
                self.rounds_paused += 1
                return
            if samples:
                self._sink(summarize_round(samples) if self.summarize else samples)
            self.rounds_done += 1
        except asyncio.CancelledError:
            raise
        except Exception:  # a periodic job: log and go on
            log.exception("probe round to %s failed", peer.node_id)

    async def probe_round(self, peer: Peer) -> list[ProbeSample]:
        """One round to one peer: ICMP, or TCP where ICMP is unavailable or blocked."""
        address = await self._resolver.resolve(peer.address)
        if address is None:
            self._warn_once(f"dns:{peer.node_id}:{peer.address}", "cannot resolve %s's address "
                            "%r: not probing it until it resolves", peer.node_id, peer.address)
            return []
        peer = replace(peer, address=address)
        p = self.settings
        blocked_left = self._icmp_blocked.get(peer.node_id, 0)
        if self._pinger is not None and (blocked_left == 0 or not peer.probe_port):
            try:
                results = await self._pinger.ping(peer.address, p.packets_per_round, p.timeout_s,
                                                  p.payload_bytes, self.packet_gap_s)
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
        p = self.settings
        results = []
        for index in range(p.packets_per_round):
            if index:
                await asyncio.sleep(self.packet_gap_s)
            results.append(await self._connector.connect(peer.address, peer.probe_port,
                                                         p.timeout_s))
        return self._samples(peer, results, ProbeKind.TCP, 0)

    def _samples(self, peer: Peer, results: Sequence[PacketResult], kind: ProbeKind,
                 payload_bytes: int) -> list[ProbeSample]:
        timeout_ms = self.settings.timeout_s * 1000
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
