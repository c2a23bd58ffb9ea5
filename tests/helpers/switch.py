"""Shared pieces of the switch's in-process tests: a raw IPv4 packet and the devices it is
written to, timed by a fake clock."""

from __future__ import annotations

import socket
import struct


def ipv4(src: str, dst: str, payload: bytes = b"x") -> bytes:
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 64, 17, 0,
                         socket.inet_aton(src), socket.inet_aton(dst))
    return header + payload


class Wire:
    """The destination devices: what was written where, and when (the fake clock's time)."""

    def __init__(self):
        self.sent: list[tuple[int, bytes, float]] = []
        self.now = 0.0

    def write(self, fd: int, packet: bytes) -> int:
        self.sent.append((fd, packet, self.now))
        return len(packet)
