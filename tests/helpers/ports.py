"""Free TCP ports for the servers the tests start on loopback."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now; the OS picks it (another process may take it before
    the caller binds, which on a test machine does not happen in practice)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
