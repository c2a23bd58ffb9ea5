"""The hostile round's throughput class: the agent's throughput sender and receiver as real
processes (`python -m agent.throughput SLOT_JSON`, one side of one test) on loopback.

- A sender aimed at servers that are no receiver (a banner, silence, an echo, random bytes, a
  proof made without the secret, a proof dripped slower than the handshake's bound, huge length
  fields, an immediate close): held when each connection got the 37-byte hello and not one byte
  more (0 payload bytes) and the sender ended within its handshake bound.
- A receiver facing clients that are not the test's sender (another address, random bytes, the
  wrong test id, the wrong secret, its own proof reflected, a slowloris, silence, a flood, 300
  connections): held when the client got nothing but at most the receiver's 48-byte proof of its
  own challenge (no payload is ever sent to a sender, and a proof opens nothing), the receiver
  counted 0 bytes, and its process ended by the slot's end plus 3 s.
- A control: a real sender and receiver measure (the counts above would show payload).
Probes run concurrently (each its own port and processes).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator

from agent.throughput import CONNECT_DELAY_MS, HANDSHAKE_S, HELLO_MAGIC, receiver_proof
from bench.hostile_common import REPO, Outcome
from bench.planner_process import free_port

HELLO = 4 + 16 + 1 + 16
PROOF = 16 + 32
WHERE = "agent/throughput.py"


def slot(role: str, port: int, *, start_in_s: float = 2.5, duration_s: float = 1.0,
         streams: int = 4, secret: bytes | None = None, test_id: str | None = None) -> dict:
    return {"test_id": test_id or os.urandom(16).hex(), "role": role, "peer_id": "peer",
            "peer_address": "127.0.0.1", "port": port,
            "start_ms": int((time.time() + start_in_s) * 1000), "duration_s": duration_s,
            "streams": streams, "secret": (secret or os.urandom(32)).hex()}


def end_ms(s: dict) -> int:
    return s["start_ms"] + CONNECT_DELAY_MS + round(s["duration_s"] * 1000) + 3000


async def side(s: dict, bind: str = "127.0.0.1") -> asyncio.subprocess.Process:
    args = [json.dumps(s)] + (["--bind", bind] if s["role"] == "receive" else [])
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.throughput", *args, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def finish(proc, by_ms: int) -> tuple[int | None, str, str, float]:
    """(exit code or None past ``by_ms``, stdout, stderr, seconds past ``by_ms`` it ended)."""
    left = max(0.1, by_ms / 1000 - time.time())
    try:
        out, err = await asyncio.wait_for(proc.communicate(), left)
    except asyncio.TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        return None, out.decode(), err.decode(), time.time() - by_ms / 1000
    return proc.returncode, out.decode(), err.decode(), time.time() - by_ms / 1000


# --------------------------------------------------------------------------- the sender's side

class NotAReceiver:
    """A server on loopback that is no throughput receiver; bytes received per connection."""

    def __init__(self, kind: str) -> None:
        self.kind, self.received = kind, []

    async def handle(self, reader, writer) -> None:
        got = [0]
        self.received.append(got)
        kind = self.kind
        try:
            if kind == "close at once":
                return
            if kind == "banner":
                writer.write(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n" + os.urandom(64))
            elif kind == "huge length fields":
                writer.write(b"\x16\x03\x01\xff\xff" + b"\xff" * 43 + b"HTTP/1.1 200 OK\r\n"
                             b"Content-Length: 99999999999999\r\n\r\n")
            elif kind == "random bytes":
                writer.write(os.urandom(1 << 20))
            hello = b""
            while len(hello) < HELLO:
                chunk = await reader.read(HELLO - len(hello))
                if not chunk:
                    return
                hello += chunk
            got[0] = len(hello)
            if kind == "echo":
                writer.write(hello)
            elif kind == "48 random bytes":
                writer.write(os.urandom(PROOF))
            elif kind in ("wrong secret", "slowloris proof"):
                nonce = os.urandom(16)
                proof = nonce + receiver_proof(os.urandom(32), hello[21:], nonce, hello[4:20],
                                               hello[20])
                if kind == "wrong secret":
                    writer.write(proof)
                else:
                    for b in proof:
                        writer.write(bytes([b]))
                        await writer.drain()
                        await asyncio.sleep(0.1)
            while chunk := await reader.read(65536):
                got[0] += len(chunk)
                if kind == "echo":
                    writer.write(chunk)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


SERVERS = ("banner", "silent", "echo", "random bytes", "48 random bytes", "wrong secret",
           "slowloris proof", "huge length fields", "close at once")


async def sender_probe(kind: str) -> Outcome:
    port = free_port()
    target = NotAReceiver(kind)
    server = await asyncio.start_server(target.handle, "127.0.0.1", port)
    s = slot("send", port, duration_s=2.0)
    started = time.monotonic()
    try:
        proc = await side(s)
        connects = s["start_ms"] + CONNECT_DELAY_MS
        bound = connects + int(HANDSHAKE_S * 1000) + 3000
        code, out, err, late = await finish(proc, bound)
        after = late + (bound - connects) / 1000
        await asyncio.sleep(0.2)
    finally:
        server.close()
        await server.wait_closed()
    conns = len(target.received)
    payload = sum(max(0, n - HELLO) for (n,) in target.received)
    took = time.monotonic() - started
    why = []
    if payload:
        why.append(f"{payload} payload bytes sent")
    if code is None:
        why.append("the sender ran past its handshake bound")
    elif code != 0:
        why.append(f"exit {code}")
    if "Traceback" in err:
        why.append("traceback: " + err.strip().splitlines()[-1][:160])
    detail = (f"{conns} connections, {sum(n for (n,) in target.received)} bytes received "
              f"({payload} after the hellos); the sender ended {after:.1f} s after it connected "
              f"(bound {HANDSHAKE_S:g} s + 3 s)")
    return Outcome(f"sender aimed at a server: {kind}", not why, code, took,
                   detail if not why else "; ".join(why) + f" ({detail})",
                   expected="0 payload bytes, ended within the handshake bound",
                   where="" if not why else WHERE + " (run_sender / handshake)")


async def control() -> Outcome:
    port, secret, test_id = free_port(), os.urandom(32), os.urandom(16).hex()
    send = slot("send", port, secret=secret, test_id=test_id, duration_s=1.0, streams=2)
    receive = {**send, "role": "receive"}
    started = time.monotonic()
    procs = [await side(receive), await side(send)]
    (code, out, err, _), (code2, _, err2, _) = await asyncio.gather(
        finish(procs[0], end_ms(receive) + 3000), finish(procs[1], end_ms(send) + 3000))
    try:
        result = json.loads(out.strip().splitlines()[-1])["result"]
    except (ValueError, IndexError, KeyError, TypeError):
        result = None
    ok = bool(result and result.get("ok") and result.get("bytes", 0) > 0)
    return Outcome("control: a real sender and receiver measure", ok, code,
                   time.monotonic() - started,
                   f"{result.get('bytes') if result else None} bytes, "
                   f"{(result or {}).get('gbps', 0):.2f} Gbit/s, {(result or {}).get('detail')}",
                   expected="ok, bytes > 0")


# ------------------------------------------------------------------------- the receiver's side

async def connect(port: int, source: str = "127.0.0.1", tries: int = 60):
    for _ in range(tries):
        try:
            return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        except ConnectionRefusedError:
            await asyncio.sleep(0.05)
    raise ConnectionRefusedError(f"nothing listens on {port}")


async def read_all(reader, limit_s: float) -> tuple[bytes, bool]:
    """What comes until the receiver closes (True) or ``limit_s`` passes (False)."""
    data = b""
    deadline = time.monotonic() + limit_s
    try:
        while time.monotonic() < deadline:
            chunk = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
            if not chunk:
                return data, True
            data += chunk
    except asyncio.TimeoutError:
        return data, False
    except (ConnectionError, OSError):
        return data, True
    return data, False


async def client(kind: str, s: dict) -> tuple[bytes, bool, str]:
    """One hostile client; (what it got, whether the receiver closed, a note)."""
    port, test_id = s["port"], bytes.fromhex(s["test_id"])
    source = "127.0.0.2" if kind == "stranger from another address" else "127.0.0.1"
    if kind == "300 silent connections":
        conns = [await connect(port) for _ in range(300)]
        results = await asyncio.gather(*(read_all(r, end_ms(s) / 1000 - time.time() + 2)
                                         for r, _ in conns))
        for _, w in conns:
            w.close()
        got = b"".join(d for d, _ in results)
        return got, all(c for _, c in results), f"{sum(c for _, c in results)} of 300 closed"
    reader, writer = await connect(port, source)
    note = ""
    try:
        challenge = os.urandom(16)
        hello = HELLO_MAGIC + test_id + b"\x00" + challenge
        if kind == "stranger from another address":
            writer.write(hello)
        elif kind == "random bytes":
            writer.write(os.urandom(HELLO))
        elif kind == "wrong test id":
            writer.write(HELLO_MAGIC + os.urandom(16) + b"\x00" + challenge)
        elif kind == "an HTTP request":
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        elif kind == "huge length fields":
            writer.write(b"\x16\x03\x01\xff\xff" + b"\xff" * 64)
        elif kind in ("wrong secret", "its own proof reflected"):
            writer.write(hello)
            proof = await asyncio.wait_for(reader.readexactly(PROOF), 3)
            answer = proof[16:] if kind == "its own proof reflected" else os.urandom(32)
            writer.write(answer)
            writer.write(bytes(1 << 16))          # and what a sender would send
            rest, closed = await read_all(reader, HANDSHAKE_S + 2)
            return proof + rest, closed, "got the 48-byte proof of its own challenge"
        elif kind == "slowloris":
            for b in hello:
                writer.write(bytes([b]))
                await writer.drain()
                await asyncio.sleep(0.2)
        elif kind == "10 MB flood":
            try:
                for _ in range(160):
                    writer.write(os.urandom(65536))
                    await asyncio.wait_for(writer.drain(), 2)
            except (ConnectionError, OSError, asyncio.TimeoutError):
                note = "the receiver stopped reading"
        start = time.monotonic()
        got, closed = await read_all(reader, HANDSHAKE_S + 2)
        return got, closed, note or f"closed after {time.monotonic() - start:.1f} s"
    except (ConnectionError, OSError, asyncio.IncompleteReadError) as err:
        return b"", True, f"{type(err).__name__}"
    finally:
        writer.close()


CLIENTS = ("stranger from another address", "random bytes", "wrong test id", "an HTTP request",
           "huge length fields", "wrong secret", "its own proof reflected", "slowloris",
           "silent", "10 MB flood", "300 silent connections")


async def receiver_probe(kind: str) -> Outcome:
    s = slot("receive", free_port(), duration_s=1.0, streams=2)
    started = time.monotonic()
    proc = await side(s)
    await asyncio.sleep(max(0.0, s["start_ms"] / 1000 - time.time() + 0.1))
    try:
        got, closed, note = await client(kind, s)
    except Exception as err:   # noqa: BLE001 - the probe broke: a failure, shown
        got, closed, note = b"", False, f"probe error {type(err).__name__}: {err}"
    code, out, err, late = await finish(proc, end_ms(s) + 3000)
    try:
        result = json.loads(out.strip().splitlines()[-1])["result"]
    except (ValueError, IndexError, KeyError, TypeError):
        result = None
    proof_only = kind in ("wrong secret", "its own proof reflected")
    why = []
    if len(got) > (PROOF if proof_only else 0):
        why.append(f"the client got {len(got)} bytes")
    if not closed:
        why.append("the receiver kept the connection open")
    if code is None:
        why.append("the receiver ran past its slot's end + 3 s")
    elif code != 0:
        why.append(f"exit {code}")
    if result is None or result.get("ok") or result.get("bytes"):
        why.append(f"the receiver's result: {result}")
    if "Traceback" in err:
        why.append("traceback: " + err.strip().splitlines()[-1][:160])
    detail = (f"client got {len(got)} bytes ({note}); receiver: "
              f"{(result or {}).get('detail')!r}, ended {late + 3:+.1f} s from the slot's end")
    return Outcome(f"receiver facing: {kind}", not why, code, time.monotonic() - started,
                   detail if not why else "; ".join(why) + f" ({detail})",
                   expected="nothing (at most its own proof), 0 bytes counted, ended by the slot",
                   where="" if not why else WHERE + " (run_receiver / _Receive)")


def throughput_round(work=None, progress=None) -> Iterator[Outcome]:
    async def run_all() -> list[Outcome]:
        outcomes = []
        for group in ([control()], [sender_probe(k) for k in SERVERS],
                      [receiver_probe(k) for k in CLIENTS]):
            outcomes += await asyncio.gather(*group)
        return outcomes

    yield from asyncio.run(run_all())
