"""Throughput tests between two agents: a receiver that exists only for its slot and a sender.

The planner hands both agents of a test a :class:`ThroughputSlot` (see hulk.wire.throughput).
The receiver listens on its throughput port from ``start_ms`` to ``end_ms`` and nothing else:

* a connection from any address but the scheduled peer's is closed at once;
* every other connection must open, in one go, with the sender's hello: ``HELLO_MAGIC``
  (4 bytes, the handshake's version), the test id (16 raw bytes), its stream index (1 byte) and
  a 16-byte random challenge the SENDER chose. An index out of range or used twice, another test
  id, or a stream beyond ``streams`` is closed;
* the receiver proves it holds the test's secret: it answers a 16-byte nonce of its own and
  HMAC-SHA256(secret, "recv" + challenge + nonce + test id + index); the sender checks it and
  only then answers HMAC-SHA256(secret, "send" + nonce + challenge + test id + index), which
  the receiver checks before it counts a byte. Each side has ``HANDSHAKE_S`` (and the slot) for
  its part: a server that speaks first (a banner), echoes or stays silent never gets a byte of
  payload, so a slot cannot aim a sender at anything but a receiver that holds the secret;
* the authenticated streams are read and counted: bytes of the first ``WARMUP_S`` after the
  first byte are not (TCP's slow start), and the window ends when the first stream ends (after
  that fewer streams share the path) or at ``end_ms``, whichever comes first.

The sender connects ``CONNECT_DELAY_MS`` after ``start_ms`` (clocks of two servers differ a
little), runs the handshake on each of ``streams`` connections and writes 64 KiB buffers for
``duration_s``. Both sides are bounded by ``end_ms``: nothing outlives its slot.

:class:`ThroughputTests` is the component the runtime owns: it takes the slots of heartbeats,
runs each at its time and hands the receiver's result to a sink (the report path).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence

from agent.clock import Clock, SystemClock, epoch_ms
from hulk.errors import InputError
from hulk.plural import count
from hulk.wire.throughput import (CONNECT_DELAY_MS, GRACE_MS, MAX_DETAIL_CHARS, SECRET_BYTES,
                                  ThroughputResult, ThroughputSlot)

__all__ = ["CONNECT_DELAY_MS", "GRACE_MS", "WARMUP_S", "SECRET_BYTES", "HANDSHAKE_S",
           "NotAReceiver", "handshake", "run_receiver", "run_sender", "ThroughputTests"]

log = logging.getLogger(__name__)

WARMUP_S = 0.5                 # bytes of the first half second after the first byte not counted
BUFFER_BYTES = 64 * 1024       # what the sender writes at a time
READ_BYTES = 1024 * 1024       # what the receiver takes from its stream buffer at a time
NONCE_BYTES = 16
HELLO_MAGIC = b"HTP2"          # handshake version 2: the sender challenges, the receiver proves
HELLO_BYTES = len(HELLO_MAGIC) + 16 + 1 + NONCE_BYTES   # magic, test id, index, challenge
PROOF_BYTES = NONCE_BYTES + 32  # the receiver's nonce and its HMAC-SHA256
ANSWER_BYTES = 32               # the sender's HMAC-SHA256
HANDSHAKE_S = 2.0               # each side's bound on the other's part of the handshake
MIN_WINDOW_S = 0.1             # a shorter measured window says nothing about the path
CONNECT_RETRY_S = 0.1          # a sender whose clock runs ahead retries a refused connect
CONNECT_RETRIES = 10
MAX_AHEAD_MS = 3_600_000       # slots further ahead than this are ignored (a wrong clock)
_ZEROS = bytes(BUFFER_BYTES)
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def receiver_proof(secret: bytes, challenge: bytes, nonce: bytes, test_id: bytes,
                   index: int) -> bytes:
    """What the receiver answers the sender's challenge with (it holds the secret)."""
    return hmac.new(secret, b"recv" + challenge + nonce + test_id + bytes([index]),
                    hashlib.sha256).digest()


def sender_proof(secret: bytes, challenge: bytes, nonce: bytes, test_id: bytes,
                 index: int) -> bytes:
    """What the sender answers the receiver's nonce with (a label apart from the receiver's:
    one side's proof reflected back is never the other's)."""
    return hmac.new(secret, b"send" + nonce + challenge + test_id + bytes([index]),
                    hashlib.sha256).digest()


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS - 3] + "..."


def failed(slot: ThroughputSlot, detail: str, *, streams: int = 0) -> ThroughputResult:
    """The result of a test that measured nothing usable."""
    return ThroughputResult(test_id=slot.test_id, sender_id=slot.peer_id, start_ms=slot.start_ms,
                            duration_s=0.0, bytes=0, streams=streams, gbps=0.0, ok=False,
                            detail=_one_line(detail))


async def _sleep_until(clock: Clock, when_ms: int) -> None:
    await clock.sleep((when_ms - epoch_ms(clock)) / 1000)


async def _until(clock: Clock, end_ms: int, work: Awaitable) -> bool:
    """Run ``work`` until it finishes (True) or ``end_ms`` comes (False: it is cancelled)."""
    task = asyncio.ensure_future(work)
    timer = asyncio.ensure_future(_sleep_until(clock, end_ms))
    try:
        await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, timer):
            t.cancel()
        await asyncio.gather(task, timer, return_exceptions=True)
    if task.cancelled():
        return False
    if task.exception() is not None:
        raise task.exception()
    return True


def _addresses(host: str) -> set[_Address] | None:
    """The IP address ``host`` is, or None when it is a name."""
    try:
        return {_plain(ipaddress.ip_address(host))}
    except ValueError:
        return None


def _plain(addr: _Address) -> _Address:
    """An IPv4-mapped IPv6 address as the IPv4 address it is."""
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped or addr


async def _peer_addresses(host: str) -> set[_Address]:
    found = _addresses(host)
    if found is not None:
        return found
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {_plain(ipaddress.ip_address(info[4][0])) for info in infos}


def _wake_per_buffer(writer: asyncio.StreamWriter) -> None:
    """Wake the receiver when a buffer's worth has arrived, not for every segment: the
    receiver's CPU is mostly wake-ups. (The end of a stream wakes it whatever the mark.)"""
    sock = writer.get_extra_info("socket")
    if sock is not None and hasattr(socket, "SO_RCVLOWAT"):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, BUFFER_BYTES)


class _Receive:
    """One receiver's connections and counts."""

    def __init__(self, slot: ThroughputSlot, clock: Clock, peers: set) -> None:
        self.slot, self.clock, self.peers = slot, clock, peers
        self.test_id = bytes.fromhex(slot.test_id)
        self.indices: set[int] = set()
        self.ended = 0                     # authenticated streams that reached their end
        self.strangers = self.refused = 0
        self.first: float | None = None    # monotonic time of the first byte
        self.window_end: float | None = None
        self.counted = 0
        self.closed = False
        self.all_done = asyncio.Event()
        self.writers: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
        self.writers.add(writer)
        index = None
        try:
            if self.closed or not self._from_peer(writer):
                self.strangers += 1
                return
            index = await self._authenticate(reader, writer)
            if index is None:
                self.refused += 1
                return
            _wake_per_buffer(writer)
            while chunk := await reader.read(READ_BYTES):
                self._count(len(chunk))
        except asyncio.TimeoutError:      # the handshake's bound passed
            self.refused += 1
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if index is not None:
                self._stream_ended()
            writer.transport.abort()
            self.writers.discard(writer)

    def _from_peer(self, writer: asyncio.StreamWriter) -> bool:
        peer = writer.get_extra_info("peername")
        try:
            return bool(peer) and _plain(ipaddress.ip_address(peer[0])) in self.peers
        except ValueError:
            return False

    async def _authenticate(self, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> int | None:
        hello = await asyncio.wait_for(reader.readexactly(HELLO_BYTES), HANDSHAKE_S)
        magic, test_id = hello[:4], hello[4:20]
        index, challenge = hello[20], hello[21:]
        if magic != HELLO_MAGIC or test_id != self.test_id or index >= self.slot.streams \
                or index in self.indices or self.closed:
            return None
        nonce = os.urandom(NONCE_BYTES)
        writer.write(nonce + receiver_proof(self.slot.secret, challenge, nonce, test_id, index))
        await writer.drain()
        answer = await asyncio.wait_for(reader.readexactly(ANSWER_BYTES), HANDSHAKE_S)
        good = hmac.compare_digest(
            answer, sender_proof(self.slot.secret, challenge, nonce, test_id, index))
        if not good or index in self.indices or self.closed:
            return None
        self.indices.add(index)
        return index

    def _count(self, n: int) -> None:
        if self.closed or self.window_end is not None:
            return
        now = self.clock.monotonic()
        if self.first is None:
            self.first = now
        if now >= self.first + WARMUP_S:
            self.counted += n

    def _stream_ended(self) -> None:
        if self.window_end is None and self.first is not None:
            self.window_end = self.clock.monotonic()
        self.ended += 1
        if self.ended >= self.slot.streams:
            self.all_done.set()

    async def close(self) -> None:
        """Stop counting, drop every connection and wait for their handlers."""
        if self.window_end is None and self.first is not None:
            self.window_end = self.clock.monotonic()
        self.closed = True
        for writer in list(self.writers):
            writer.transport.abort()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def result(self, mono_to_epoch: float) -> ThroughputResult:
        slot, streams = self.slot, len(self.indices)
        if not streams:
            if self.refused:
                return failed(slot, f"no stream authenticated ({self.refused} refused)")
            if self.strangers:
                return failed(slot, f"the sender never came ({count(self.strangers, 'connection')} "
                                    "from other addresses refused)")
            return failed(slot, "the sender never came")
        start = (self.first or 0.0) + WARMUP_S
        window = max(0.0, (self.window_end or start) - start)
        start_ms = (max(0, int((start + mono_to_epoch) * 1000)) if self.first is not None
                    else slot.start_ms)
        problem = ""
        if streams < slot.streams:
            problem = f"{streams} of {count(slot.streams, 'stream')} authenticated"
        elif window < MIN_WINDOW_S or not self.counted:
            problem = f"measured window {window:.2f} s too short"
        if problem:
            return ThroughputResult(slot.test_id, slot.peer_id, start_ms, round(window, 6),
                                    self.counted, streams, 0.0, False, _one_line(problem))
        gbps = self.counted * 8 / window / 1e9
        return ThroughputResult(slot.test_id, slot.peer_id, start_ms, round(window, 6),
                                self.counted, streams, gbps, True)


async def run_receiver(slot: ThroughputSlot, *, bind_host: str = "0.0.0.0",
                       clock: Clock | None = None) -> ThroughputResult:
    """Listen for the slot's sender from ``start_ms`` to ``end_ms`` (or until every stream has
    ended) and return what came through."""
    clock = clock or SystemClock()
    if slot.role != "receive":
        raise InputError(f"expected a receive slot, got {slot.role!r}", field="slot.role")
    await _sleep_until(clock, slot.start_ms)
    if epoch_ms(clock) >= slot.end_ms:
        return failed(slot, "the slot had ended before the receiver could start")
    peers = await _peer_addresses(slot.peer_address)
    if not peers:
        return failed(slot, f"cannot resolve the sender's address {slot.peer_address!r}")
    session = _Receive(slot, clock, peers)
    try:
        server = await asyncio.start_server(session.handle, bind_host, slot.port,
                                            reuse_address=True, limit=4 * BUFFER_BYTES)
    except OSError as err:
        return failed(slot, f"cannot listen on {bind_host}:{slot.port}: "
                            f"{err.strerror or err}")
    try:
        await _until(clock, slot.end_ms, session.all_done.wait())
    finally:
        server.close()
        await session.close()
        await server.wait_closed()
    return session.result(clock.now() - clock.monotonic())


async def _connect(slot: ThroughputSlot, clock: Clock) -> tuple[asyncio.StreamReader,
                                                                 asyncio.StreamWriter]:
    for attempt in range(CONNECT_RETRIES + 1):
        try:
            return await asyncio.open_connection(slot.peer_address, slot.port)
        except ConnectionRefusedError:
            if attempt == CONNECT_RETRIES:
                raise
            await clock.sleep(CONNECT_RETRY_S)
    raise AssertionError("unreachable")


class NotAReceiver(ConnectionError):
    """The other end did not prove it holds the test's secret: not one payload byte goes to it."""


async def handshake(slot: ThroughputSlot, index: int, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
    """The sender's side: challenge, check the receiver's proof within HANDSHAKE_S, answer.
    Raises NotAReceiver for a wrong or missing proof."""
    test_id, challenge = bytes.fromhex(slot.test_id), os.urandom(NONCE_BYTES)
    writer.write(HELLO_MAGIC + test_id + bytes([index]) + challenge)
    try:
        proof = await asyncio.wait_for(reader.readexactly(PROOF_BYTES), HANDSHAKE_S)
    except asyncio.TimeoutError:
        raise NotAReceiver(f"no proof of the secret within {HANDSHAKE_S:g} s") from None
    except asyncio.IncompleteReadError:
        raise NotAReceiver("the connection closed before a proof of the secret") from None
    nonce, mac = proof[:NONCE_BYTES], proof[NONCE_BYTES:]
    if not hmac.compare_digest(mac, receiver_proof(slot.secret, challenge, nonce, test_id,
                                                   index)):
        raise NotAReceiver("a wrong proof of the secret")
    writer.write(sender_proof(slot.secret, challenge, nonce, test_id, index))


async def _send_stream(slot: ThroughputSlot, index: int, stop: float, clock: Clock) -> None:
    reader, writer = await _connect(slot, clock)
    try:
        await handshake(slot, index, reader, writer)
        while clock.monotonic() < stop:
            writer.write(_ZEROS)
            await writer.drain()
    except NotAReceiver:
        writer.transport.abort()    # nothing buffered may follow
        raise
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def run_sender(slot: ThroughputSlot, *, clock: Clock | None = None) -> None:
    """Send to the slot's receiver for ``duration_s`` over ``streams`` connections; a refusal or
    a broken connection ends the test (one log line), never raises."""
    clock = clock or SystemClock()
    if slot.role != "send":
        raise InputError(f"expected a send slot, got {slot.role!r}", field="slot.role")
    await _sleep_until(clock, slot.start_ms + CONNECT_DELAY_MS)
    stop = clock.monotonic() + slot.duration_s
    tasks = [asyncio.ensure_future(_send_stream(slot, i, stop, clock))
             for i in range(slot.streams)]
    try:
        if not await _until(clock, slot.end_ms, asyncio.gather(*tasks)):
            log.warning("throughput test %s to %s: still sending at the end of its slot",
                        slot.test_id, slot.peer_id)
    except (ConnectionError, OSError, asyncio.IncompleteReadError) as err:
        why = "the receiver closed the connection" if isinstance(
            err, asyncio.IncompleteReadError) else (getattr(err, "strerror", None) or str(err))
        if isinstance(err, NotAReceiver):
            why = f"not the test's receiver: {err} (no payload sent)"
        log.warning("throughput test %s to %s (%s:%d) failed: %s", slot.test_id, slot.peer_id,
                    slot.peer_address, slot.port, why)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class ThroughputTests:
    """Takes slots (from heartbeats), runs each at its time, hands receivers' results on."""

    def __init__(self, *, port: int, sink: Callable[[ThroughputResult], None],
                 clock: Clock | None = None, bind_host: str = "0.0.0.0") -> None:
        self.port, self.sink, self.bind_host = port, sink, bind_host
        self.clock = clock or SystemClock()
        self._seen: dict[tuple[str, str], int] = {}   # (test_id, role) -> when to forget it
        self._pending: list[ThroughputSlot] = []
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._open: dict[tuple[str, str], ThroughputSlot] = {}   # accepted, slot not ended

    def accept(self, slots: Sequence[ThroughputSlot]) -> None:
        """Queue new slots; ignore repeats, and (one log line each) slots already ended, more
        than an hour ahead, malformed, or for a port that is not this agent's."""
        now = epoch_ms(self.clock)
        self._seen = {k: v for k, v in self._seen.items() if v > now}
        for slot in slots:
            key = (str(getattr(slot, "test_id", "")), str(getattr(slot, "role", "")))
            if key in self._seen:
                continue
            why = self._why_not(slot, now)
            # Remembered an hour past its end: a heartbeat may repeat a slot after it ran.
            end = slot.end_ms if not why.startswith("malformed") else now
            self._seen[key] = max(end, now) + MAX_AHEAD_MS
            if why:
                log.warning("throughput slot %s (%s) ignored: %s", key[0][:32], key[1][:8], why)
                continue
            self._pending.append(slot)
            self._open[key] = slot
        if self._pending:
            self._wake.set()

    def _why_not(self, slot: ThroughputSlot, now: int) -> str:
        try:
            slot.check("throughput_slot")
        except (InputError, AttributeError, TypeError) as err:
            return f"malformed: {err}"
        if slot.role == "receive" and slot.port != self.port:
            return f"port {slot.port} is not this agent's throughput port {self.port}"
        if slot.end_ms <= now:
            return "its slot has ended"
        if slot.start_ms > now + MAX_AHEAD_MS:
            return "it starts more than an hour ahead"
        return ""

    def testing(self, now_ms: int) -> bool:
        """Whether this node is in a test at ``now_ms``: a slot it took has started and not
        ended (the prober keeps quiet meanwhile). Held to the slot's end even when this side is
        done: a sender's writes return while its socket buffers still drain through the path."""
        self._open = {k: s for k, s in self._open.items() if s.end_ms > now_ms}
        return any(s.start_ms <= now_ms for s in self._open.values())

    @property
    def active(self) -> int:
        """Tests waiting for their time or running."""
        return len(self._tasks)

    async def run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                pending, self._pending = self._pending, []
                for slot in pending:
                    task = asyncio.create_task(self._run_one(slot))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run_one(self, slot: ThroughputSlot) -> None:
        await self._run_and_hand_on(slot)   # its slot stays open (testing()) until end_ms

    async def _run_and_hand_on(self, slot: ThroughputSlot) -> None:
        try:
            if slot.role == "send":
                await run_sender(slot, clock=self.clock)
                return
            result = await run_receiver(slot, bind_host=self.bind_host, clock=self.clock)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # one failed test must not end the component
            log.warning("throughput test %s (%s) failed: %s: %s", slot.test_id, slot.role,
                        type(err).__name__, err)
            if slot.role == "send":
                return
            result = failed(slot, f"receiver error: {type(err).__name__}: {err}")
        try:
            self.sink(result)
        except Exception as err:  # the sink is the runtime's; log and go on
            log.warning("throughput result %s not handed on: %s: %s", slot.test_id,
                        type(err).__name__, err)


def slot_to_json(slot: ThroughputSlot) -> dict:
    """A slot as JSON values (the secret in hex), for :func:`main`."""
    data = {f: getattr(slot, f) for f in ThroughputSlot.__dataclass_fields__}
    data["secret"] = slot.secret.hex()
    return data


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agent.throughput SLOT_JSON [--bind HOST]``: run one side of one test (labs and
    benchmarks start it inside a namespace) and print one JSON line: the receiver's result (null
    for the sender) and the CPU seconds this side used."""
    import argparse
    import dataclasses
    import json
    import time

    parser = argparse.ArgumentParser(prog="python -m agent.throughput",
                                     description="Run one side of one throughput test.")
    parser.add_argument("slot", help="the slot as JSON (the secret in hex)")
    parser.add_argument("--bind", default="0.0.0.0", help="the receiver's listening address")
    args = parser.parse_args(argv)
    try:
        data = json.loads(args.slot)
        data["secret"] = bytes.fromhex(data["secret"])
        slot = ThroughputSlot(**data).check("slot")
    except (ValueError, KeyError, TypeError, InputError) as err:
        print(f"python -m agent.throughput: bad slot: {err}")
        return 2
    cpu = time.process_time()
    if slot.role == "receive":
        result = asyncio.run(run_receiver(slot, bind_host=args.bind))
        shown = dataclasses.asdict(result)
    else:
        asyncio.run(run_sender(slot))
        shown = None
    print(json.dumps({"result": shown, "cpu_s": round(time.process_time() - cpu, 4)}),
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
