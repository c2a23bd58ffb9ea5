"""Throughput tests with real TCP: on loopback (127.0.0.0/8 gives a stranger its own address),
and through a veth pair shaped by tbf between two network namespaces."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from agent.clock import SystemClock, epoch_ms
from agent.throughput import (CONNECT_DELAY_MS, HANDSHAKE_S, HELLO_MAGIC, ThroughputTests, main,
                              receiver_proof, run_receiver, run_sender, sender_proof, slot_to_json)
from hulk.wire.throughput import ThroughputResult, ThroughputSlot
from tests.helpers.paths import REPO
from tests.helpers.ports import free_port

PEER, STRANGER = "127.0.0.1", "127.0.0.2"


class FastClock:
    """Wall and monotonic time running ``speed`` times faster than real time: a slot of seconds
    passes in a fraction of one, over real sockets."""

    def __init__(self, speed: float = 10.0) -> None:
        self.speed, self.base, self.m0 = speed, time.time(), time.monotonic()

    def monotonic(self) -> float:
        return (time.monotonic() - self.m0) * self.speed

    def now(self) -> float:
        return self.base + self.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.speed)


def slots(port: int, clock, *, ahead_ms: int = 200, duration_s: float = 1.0, streams: int = 4,
          sender_address: str = PEER) -> tuple[ThroughputSlot, ThroughputSlot]:
    common = dict(test_id=os.urandom(16).hex(), port=port, start_ms=epoch_ms(clock) + ahead_ms,
                  duration_s=duration_s, streams=streams, secret=os.urandom(32))
    send = ThroughputSlot(role="send", peer_id="receiver", peer_address=PEER, **common)
    receive = ThroughputSlot(role="receive", peer_id="sender", peer_address=sender_address,
                             **common)
    return send, receive


async def until_slot_start(clock, slot: ThroughputSlot, extra_ms: int = 0) -> None:
    """What a sender does: wait for the slot (the receiver listens from its start)."""
    await clock.sleep((slot.start_ms + extra_ms - epoch_ms(clock)) / 1000)


def assert_refused(port: int) -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((PEER, port), timeout=5).close()


@pytest.mark.slow
async def test_a_sender_and_its_receiver_measure_over_loopback():
    port = free_port()
    send, receive = slots(port, SystemClock())
    result, _ = await asyncio.gather(run_receiver(receive, bind_host=PEER), run_sender(send))
    assert result.check() == result
    assert result.ok and result.detail == ""
    assert (result.test_id, result.sender_id, result.streams) == (send.test_id, "sender", 4)
    assert result.bytes > 0 and 0.1 <= result.duration_s <= send.duration_s
    assert result.gbps == pytest.approx(result.bytes * 8 / result.duration_s / 1e9)
    assert send.start_ms <= result.start_ms <= send.end_ms
    assert_refused(port)       # the receiver exists only for its slot


async def stranger(port: int, slot: ThroughputSlot, clock) -> bytes:
    """A client from another address that knows the secret: it gets nothing, not even a nonce."""
    await until_slot_start(clock, slot, CONNECT_DELAY_MS // 2)
    reader, writer = await asyncio.open_connection(PEER, port, local_addr=(STRANGER, 0))
    try:
        return await reader.read(100)
    except ConnectionError:
        return b""
    finally:
        writer.close()


@pytest.mark.slow
async def test_a_stranger_from_another_address_is_closed_at_once():
    port = free_port()
    clock = SystemClock()
    send, receive = slots(port, clock)
    result, got, _ = await asyncio.gather(run_receiver(receive, bind_host=PEER),
                                          stranger(port, receive, clock), run_sender(send))
    assert got == b""
    assert result.ok and result.streams == 4


def hello(slot: ThroughputSlot, how: str) -> tuple[bytes, bytes, int]:
    """A sender's hello (and its challenge and index), wrong in the way ``how`` says."""
    test_id = os.urandom(16) if how == "wrong test id" else bytes.fromhex(slot.test_id)
    index = slot.streams if how == "index out of range" else 0
    challenge = os.urandom(16)
    return HELLO_MAGIC + test_id + bytes([index]) + challenge, challenge, index


async def handshake_as(reader, writer, slot: ThroughputSlot, how: str) -> None:
    message, challenge, index = hello(slot, how)
    writer.write(message)
    proof = await reader.readexactly(48)
    secret = os.urandom(32) if how == "wrong secret" else slot.secret
    nonce = proof[:16]
    assert proof[16:] == receiver_proof(slot.secret, challenge, nonce, message[4:20], index)
    writer.write(sender_proof(secret, challenge, nonce, message[4:20], index))


async def impostor(port: int, slot: ThroughputSlot, clock, how: str) -> bytes:
    """Connects from the scheduled address but runs the handshake wrongly; returns what it
    reads after its answer (b"": closed)."""
    await until_slot_start(clock, slot, CONNECT_DELAY_MS)
    if how == "index used twice":    # a first stream takes index 0 and stays open
        reader, writer = await asyncio.open_connection(PEER, port)
        await handshake_as(reader, writer, slot, "right")
    reader, writer = await asyncio.open_connection(PEER, port)
    try:
        if how == "wrong secret":
            await handshake_as(reader, writer, slot, how)
        else:
            writer.write(hello(slot, how)[0])
        return await reader.read(100)
    except ConnectionError:
        return b""
    finally:
        writer.close()


@pytest.mark.parametrize("how", ["wrong secret", "wrong test id", "index out of range",
                                 "index used twice"])
async def test_a_wrong_answer_to_the_challenge_is_refused(how):
    port, clock = free_port(), FastClock()
    _, receive = slots(port, clock, ahead_ms=1000)
    result, after = await asyncio.wait_for(asyncio.gather(
        run_receiver(receive, bind_host=PEER, clock=clock), impostor(port, receive, clock, how)),
        timeout=60)
    assert after == b""              # the refused stream was closed
    assert not result.ok and result.gbps == 0.0
    if how == "index used twice":    # the first stream counted, the second refused
        assert result.streams == 1 and "1 of 4 streams" in result.detail
    else:
        assert result.streams == 0 and result.detail == "no stream authenticated (1 refused)"
    assert result.check() == result


async def silent(port: int, slot: ThroughputSlot, clock) -> bytes:
    """Connects from the right address and never says a word, never closes."""
    await until_slot_start(clock, slot, CONNECT_DELAY_MS)
    reader, writer = await asyncio.open_connection(PEER, port)
    got = await reader.read(100)      # returns when the receiver drops the connection
    writer.close()
    return got


async def test_a_receiver_whose_sender_never_comes_fails_and_closes_at_the_end():
    port, clock = free_port(), FastClock()
    _, receive = slots(port, clock, ahead_ms=1000)
    result = await asyncio.wait_for(run_receiver(receive, bind_host=PEER, clock=clock), 60)
    assert epoch_ms(clock) >= receive.end_ms
    assert not result.ok and result.streams == 0 and result.bytes == 0
    assert result.detail == "the sender never came"
    assert_refused(port)


async def test_a_client_that_never_answers_cannot_hold_the_receiver_open():
    port, clock = free_port(), FastClock()
    _, receive = slots(port, clock, ahead_ms=1000)
    result, got = await asyncio.wait_for(asyncio.gather(
        run_receiver(receive, bind_host=PEER, clock=clock), silent(port, receive, clock)), 60)
    assert got == b""                # the sender speaks first: the receiver said nothing
    # dropped at the slot's end or after HANDSHAKE_S, whichever comes first
    assert not result.ok and result.detail in ("the sender never came",
                                               "no stream authenticated (1 refused)")
    assert_refused(port)


async def test_a_sender_refused_by_the_receiver_ends_without_raising(caplog):
    port, clock = free_port(), FastClock()
    send, receive = slots(port, clock, ahead_ms=1000, sender_address=STRANGER)
    with caplog.at_level(logging.WARNING, logger="agent.throughput"):
        result, _ = await asyncio.wait_for(asyncio.gather(
            run_receiver(receive, bind_host=PEER, clock=clock), run_sender(send, clock=clock)), 60)
    assert not result.ok and "other addresses refused" in result.detail
    assert any(why in r.getMessage() for r in caplog.records
               for why in ("the receiver closed the connection", "not the test's receiver",
                           "Connection reset by peer"))


def test_accept_dedupes_and_ignores_ended_far_and_malformed_slots(caplog):
    clock = SystemClock()
    tests = ThroughputTests(port=7777, sink=lambda r: None, clock=clock)
    send, receive = slots(7777, clock, ahead_ms=60_000)
    ended = slots(7777, clock, ahead_ms=-60_000)[1]
    far = slots(7777, clock, ahead_ms=2 * 3600_000)[0]
    bad_secret = ThroughputSlot(**{**slot_to_json(receive), "test_id": "ab" * 16,
                                   "secret": b"short"})
    other_port = slots(7778, clock, ahead_ms=60_000)[1]
    with caplog.at_level(logging.WARNING, logger="agent.throughput"):
        for _ in range(3):
            tests.accept([send, receive, send, ended, far, bad_secret, other_port])
    assert tests._pending == [send, receive]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4, lines            # one line per ignored slot, not per heartbeat
    assert any("ended" in m for m in lines) and any("hour ahead" in m for m in lines)
    assert any("secret" in m for m in lines) and any("port 7778" in m for m in lines)


@pytest.mark.slow
async def test_the_component_runs_both_sides_and_hands_the_result_on():
    port, clock = free_port(), SystemClock()
    got: list[ThroughputResult] = []
    done = asyncio.Event()

    def sink(result: ThroughputResult) -> None:
        got.append(result)
        done.set()

    receiver = ThroughputTests(port=port, sink=sink, clock=clock, bind_host=PEER)
    from_sender: list[ThroughputResult] = []
    sender = ThroughputTests(port=free_port(), sink=from_sender.append, clock=clock)
    send, receive = slots(port, clock, ahead_ms=300, duration_s=0.8, streams=2)
    runs = [asyncio.create_task(c.run()) for c in (receiver, sender)]
    receiver.accept([receive])
    sender.accept([send])
    await asyncio.wait_for(done.wait(), 60)
    for run in runs:
        run.cancel()
    await asyncio.gather(*runs, return_exceptions=True)
    assert len(got) == 1 and got[0].ok and got[0].streams == 2
    assert from_sender == []         # only receivers report
    assert receiver.active == 0 and sender.active == 0


async def test_a_failing_test_or_sink_does_not_stop_the_component():
    port, clock = free_port(), FastClock()
    got: asyncio.Queue[ThroughputResult] = asyncio.Queue()

    def sink(result: ThroughputResult) -> None:
        got.put_nowait(result)
        if got.qsize() == 1:
            raise RuntimeError("the spool is full")

    tests = ThroughputTests(port=port, sink=sink, clock=clock, bind_host=PEER)
    run = asyncio.create_task(tests.run())
    with socket.socket() as blocker:
        blocker.bind((PEER, port))
        blocker.listen()
        tests.accept([slots(port, clock, ahead_ms=200)[1]])
        first = await asyncio.wait_for(got.get(), 60)
    second = slots(port, clock, ahead_ms=500)[1]
    tests.accept([second])
    then = await asyncio.wait_for(got.get(), 60)
    assert not run.done()
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    assert "cannot listen" in first.detail and not first.ok
    assert then.test_id == second.test_id and then.detail == "the sender never came"


@pytest.mark.parametrize("text, says", [("{", "bad slot"), ('{"role": "send"}', "bad slot"),
                                         ("SECRET", "secret")])
def test_the_one_test_command_refuses_a_bad_slot_in_one_line(text, says, capsys):
    good = slot_to_json(slots(7000, SystemClock())[0])
    if text == "SECRET":
        text = json.dumps({**good, "secret": "00" * 31})
    assert main([text]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and says in out


RATE_MBIT = 100


@pytest.mark.process
@pytest.mark.root
async def test_a_test_through_a_link_shaped_by_tbf_measures_its_rate(lab_host):
    """The sender in a namespace whose veth egress is shaped to RATE_MBIT; the receiver here."""
    ns, inner = lab_host.netns, "eth0"
    here = lab_host.answering.rsplit(".", 1)[0] + ".1"
    subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", inner, "root", "tbf", "rate",
                    f"{RATE_MBIT}mbit", "burst", "64kb", "latency", "50ms"], check=True)
    try:
        port = free_port(here)
        clock = SystemClock()
        common = dict(test_id=os.urandom(16).hex(), port=port, start_ms=epoch_ms(clock) + 1500,
                      duration_s=2.0, streams=4, secret=os.urandom(32))
        send = ThroughputSlot(role="send", peer_id="r", peer_address=here, **common)
        receive = ThroughputSlot(role="receive", peer_id="s", peer_address=lab_host.answering,
                                 **common)
        proc = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", ns, sys.executable, "-m", "agent.throughput",
            json.dumps(slot_to_json(send)), cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        result = await run_receiver(receive, bind_host=here, clock=clock)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
    finally:
        subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", inner, "root"],
                       capture_output=True)
    assert result.ok, result.detail
    assert json.loads(out)["result"] is None
    assert result.gbps * 1000 == pytest.approx(RATE_MBIT, rel=0.10)


class NotAReceiverServer:
    """A TCP server on loopback that is no throughput receiver: it greets like SSH ("banner"),
    says nothing ("silent") or echoes what it gets ("echo"); it counts every byte it receives."""

    def __init__(self, kind: str) -> None:
        self.kind, self.received = kind, 0

    async def handle(self, reader, writer) -> None:
        if self.kind == "banner":
            writer.write(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n" + os.urandom(64))
        try:
            while chunk := await reader.read(65536):
                self.received += len(chunk)
                if self.kind == "echo":
                    writer.write(chunk)
        except ConnectionError:
            pass
        finally:
            writer.close()


HELLO_BYTES = 4 + 16 + 1 + 16


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["banner", "silent", "echo"])
async def test_a_sender_aimed_at_a_server_that_is_no_receiver_sends_it_no_payload(kind, caplog):
    port, clock = free_port(), SystemClock()
    target = NotAReceiverServer(kind)
    server = await asyncio.start_server(target.handle, PEER, port)
    send, _ = slots(port, clock, ahead_ms=0, duration_s=2.0, streams=4)
    try:
        with caplog.at_level(logging.WARNING, logger="agent.throughput"):
            started = time.monotonic()
            await asyncio.wait_for(run_sender(send, clock=clock), 60)
            took = time.monotonic() - started
        await asyncio.sleep(0.2)
    finally:
        server.close()
        await server.wait_closed()
    # Only the 4 hellos; not a byte of test payload.
    assert target.received == 4 * HELLO_BYTES
    assert took < CONNECT_DELAY_MS / 1000 + HANDSHAKE_S + 1.0   # bounded by the handshake
    assert any("not the test's receiver" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
async def test_a_sender_stays_paused_for_probes_until_its_slot_ends():
    """Its writes return while its socket buffers still drain: the pause lasts to end_ms."""
    port, clock = free_port(), FastClock(speed=4.0)
    receiver = ThroughputTests(port=port, sink=lambda r: None, clock=clock, bind_host=PEER)
    sender = ThroughputTests(port=free_port(), sink=lambda r: None, clock=clock)
    send, receive = slots(port, clock, ahead_ms=400, duration_s=1.0, streams=2)
    runs = [asyncio.create_task(c.run()) for c in (receiver, sender)]
    receiver.accept([receive])
    sender.accept([send])
    try:
        async def sender_done() -> None:
            while not (sender.active == 0 and epoch_ms(clock) > send.start_ms):
                await asyncio.sleep(0.01)
        await asyncio.wait_for(sender_done(), 60)
        assert epoch_ms(clock) < send.end_ms
        assert sender.testing(epoch_ms(clock))         # done sending, still paused
        await clock.sleep((send.end_ms - epoch_ms(clock)) / 1000 + 0.05)
        assert not sender.testing(epoch_ms(clock))
    finally:
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
