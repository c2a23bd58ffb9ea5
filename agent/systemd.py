"""sd_notify without dependencies: datagrams to $NOTIFY_SOCKET.

READY=1 once the agent runs, WATCHDOG=1 at half of $WATCHDOG_USEC, STATUS=... for
`systemctl status`, STOPPING=1 on shutdown. Not under systemd (no NOTIFY_SOCKET): every call
is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class SystemdNotifier:
    def __init__(self, notify_socket: str | None, watchdog_usec: int | None = None):
        self.address = notify_socket or None
        self.watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        self._sock: socket.socket | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SystemdNotifier:
        """Reads systemd's variables (NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID)."""
        environ = os.environ if environ is None else environ
        usec: int | None = None
        try:
            usec = int(environ.get("WATCHDOG_USEC", "") or 0) or None
        except ValueError:
            log.warning("ignoring WATCHDOG_USEC=%r: not a number", environ.get("WATCHDOG_USEC"))
        watchdog_pid = environ.get("WATCHDOG_PID")
        if watchdog_pid and watchdog_pid != str(os.getpid()):
            usec = None  # the watchdog is meant for another process (e.g. our parent)
        return cls(environ.get("NOTIFY_SOCKET"), usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to send WATCHDOG=1: half the timeout systemd was given."""
        return self.watchdog_usec / 2 / 1e6 if self.watchdog_usec else None

    def notify(self, *assignments: str) -> bool:
        """Send "KEY=value" lines in one datagram. Never raises: returns whether it was sent."""
        if self.address is None:
            return False
        address = self.address
        if address.startswith("@"):  # abstract namespace
            address = "\0" + address[1:]
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(assignments).encode(), address)
            return True
        except OSError as err:
            log.warning("sd_notify to %s failed: %s", self.address, err)
            return False

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def stopping(self, status: str = "") -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
