"""Throughput tests between lab hosts with the agent's own engine (agent/throughput.py).

Each side runs as ``python -m agent.throughput SLOT_JSON`` inside its host's namespace (and its
CPU group, so a slow host measures as slowly as it would really receive), with the slot a planner
would hand it: a random test id and one-time secret, the receiver's port, a start time far enough
ahead for both processes to start on a host with a small CPU quota. Tests of one round run at the
same time and share no host, as the planner's scheduler would have them.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hulk.wire.throughput import SECRET_BYTES, ThroughputSlot
from lab.wan import REPO, WanLab

PORT = 5201
# From launch to the slot's start: a process on a host with 0.15 of a core needs about 2 s to
# import the engine.
LEAD_S = 4.0


@dataclass(frozen=True)
class Measured:
    sender: str
    receiver: str
    gbps: float
    ok: bool
    detail: str
    duration_s: float
    streams: int


def slots(sender: str, receiver: str, lab: WanLab, *, start_ms: int, duration_s: float,
          streams: int, port: int = PORT) -> tuple[ThroughputSlot, ThroughputSlot]:
    """(send, receive) slots of one test, as planner.core.throughput_schedule.slots_for makes."""
    test_id, secret = secrets.token_hex(16), secrets.token_bytes(SECRET_BYTES)
    common = dict(test_id=test_id, port=port, start_ms=start_ms, duration_s=duration_s,
                  streams=streams, secret=secret)
    send = ThroughputSlot(role="send", peer_id=receiver, peer_address=lab.address(receiver), **common)
    receive = ThroughputSlot(role="receive", peer_id=sender, peer_address=lab.address(sender),
                             **common)
    return send.check("send"), receive.check("receive")


def slot_json(slot: ThroughputSlot) -> str:
    """A throughput slot as the JSON argument ``python -m agent.throughput`` takes."""
    data = {name: getattr(slot, name) for name in ThroughputSlot.__dataclass_fields__}
    data["secret"] = slot.secret.hex()
    return json.dumps(data)


def measure_round(lab: WanLab, pairs: Sequence[tuple[str, str]], *, duration_s: float = 2.0,
                  streams: int = 4, python: str | None = None) -> list[Measured]:
    """Run one test per (sender, receiver) pair, all at once; no host may appear twice."""
    hosts = [h for pair in pairs for h in pair]
    if len(set(hosts)) != len(hosts):
        raise ValueError("tests of one round must not share a host")
    python = python or lab.python
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    start_ms = int((time.time() + LEAD_S) * 1000)
    running = []
    for sender, receiver in pairs:
        send, receive = slots(sender, receiver, lab, start_ms=start_ms, duration_s=duration_s,
                              streams=streams)
        procs = [lab.popen(host, [python, "-m", "agent.throughput", slot_json(slot)], env=env,
                           cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for host, slot in ((receiver, receive), (sender, send))]
        running.append((sender, receiver, receive, procs))
    out = []
    for sender, receiver, receive, procs in running:
        limit = LEAD_S + (receive.end_ms - start_ms) / 1000 + 30
        texts = []
        for proc in procs:
            try:
                texts.append(proc.communicate(timeout=limit))
            except subprocess.TimeoutExpired:
                proc.kill()
                texts.append(proc.communicate())
        stdout, stderr = texts[0]
        try:
            result = json.loads(stdout.strip().splitlines()[-1])["result"]
        except (ValueError, IndexError, KeyError, TypeError):
            out.append(Measured(sender, receiver, 0.0, False,
                                f"receiver said: {(stdout + stderr).strip()[-200:]}", 0.0, 0))
            continue
        out.append(Measured(sender, receiver, float(result["gbps"]), bool(result["ok"]),
                            str(result.get("detail", "")), float(result["duration_s"]),
                            int(result["streams"])))
    return out


def rounds(pairs: Sequence[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """``pairs`` grouped greedily into rounds in which no host is in two tests."""
    left, out = list(pairs), []
    while left:
        busy: set[str] = set()
        this, rest = [], []
        for a, b in left:
            if a in busy or b in busy:
                rest.append((a, b))
            else:
                this.append((a, b))
                busy.update((a, b))
        out.append(this)
        left = rest
    return out


def measure(lab: WanLab, pairs: Sequence[tuple[str, str]], **kwargs) -> list[Measured]:
    """Every pair's test, in as few rounds as hosts allow."""
    return [m for group in rounds(pairs) for m in measure_round(lab, group, **kwargs)]
