"""Peers from the planner's answer: checked before they are probed, their names resolved off
the event loop.

- peer_problem(): why a peer cannot be probed (a port outside 0-65535, no address, an address
  that is neither an IP address nor a host name, an unusable node id), or None. The prober
  skips such a peer with one warning, not a traceback a round.
- paced_interval_s(): the probe interval that keeps an agent under its probe-rate cap
  (``max_probe_rate`` packets per second) however many peers the planner names.
- PeerResolver: an IP address is used as it is; a host name is looked up on a thread of its
  own, waited for at most ``timeout_s`` and cached (answers for ``ttl_s``, failures for
  ``negative_ttl_s``). One lookup per name at a time and at most ``max_lookups`` at once, so a
  name that never resolves costs one thread and delays only its own rounds.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable

from hulk.wire.records import Peer

MAX_NODE_ID_CHARS = 255
MAX_ADDRESS_CHARS = 253            # the longest DNS name
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def is_ip_address(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def peer_problem(peer: Peer) -> str | None:
    """Why the agent cannot probe ``peer``; None when it can."""
    node_id = peer.node_id
    if not node_id or len(node_id) > MAX_NODE_ID_CHARS or not node_id.isprintable():
        return f"unusable node id {_shown(node_id)}"
    if not 0 <= peer.probe_port <= 65535:
        return f"probe port {peer.probe_port} is outside 0-65535"
    address = peer.address
    if not address:
        return "no address"
    if len(address) > MAX_ADDRESS_CHARS:
        return f"an address of {len(address)} characters"
    if not is_ip_address(address) and not HOSTNAME_RE.match(address):
        return f"address {_shown(address)} is neither an IP address nor a host name"
    return None


def paced_interval_s(interval_s: float, peers: int, packets_per_round: int,
                     max_probe_rate: float) -> float:
    """Seconds between rounds to each peer so that ``peers`` peers at ``packets_per_round``
    packets a round stay under ``max_probe_rate`` packets per second: ``interval_s``, or
    longer when the list is too long for it."""
    if peers <= 0 or max_probe_rate <= 0:
        return interval_s
    return max(interval_s, peers * packets_per_round / max_probe_rate)


def lookup_address(name: str) -> str | None:
    """The first address ``name`` resolves to (blocking: run it off the event loop)."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError, ValueError):
        return None
    return str(infos[0][4][0]) if infos else None


class PeerResolver:
    """Peer addresses to IP addresses without blocking the event loop (see the module doc)."""

    def __init__(self, *, timeout_s: float = 2.0, ttl_s: float = 300.0,
                 negative_ttl_s: float = 60.0, max_lookups: int = 8,
                 lookup: Callable[[str], str | None] = lookup_address,
                 monotonic: Callable[[], float] = time.monotonic):
        self.timeout_s, self.ttl_s, self.negative_ttl_s = timeout_s, ttl_s, negative_ttl_s
        self.max_lookups = max_lookups
        self._lookup = lookup
        self._monotonic = monotonic
        self._cache: dict[str, tuple[str | None, float]] = {}   # name -> (address, expires at)
        self._running: dict[str, asyncio.Future] = {}

    async def resolve(self, address: str) -> str | None:
        """An IP address for ``address``; None when it does not resolve (in time)."""
        if is_ip_address(address):
            return address
        cached = self._cache.get(address)
        if cached is not None and cached[1] > self._monotonic():
            return cached[0]
        lookup = self._running.get(address)
        if lookup is None:
            if len(self._running) >= self.max_lookups:
                return None  # too many names hanging already: try again next round
            lookup = self._start(address)
        try:  # asyncio.timeout, not wait_for: that may swallow a cancel in 3.11
            async with asyncio.timeout(self.timeout_s):
                return await asyncio.shield(lookup)
        except TimeoutError:
            return None  # the lookup goes on; its answer is cached when it comes

    def _start(self, name: str) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._running[name] = future

        def settle(address: str | None) -> None:
            self._running.pop(name, None)
            ttl = self.ttl_s if address is not None else self.negative_ttl_s
            if len(self._cache) > 4096:  # names come from the peer list; forget stale ones
                now = self._monotonic()
                self._cache = {k: v for k, v in self._cache.items() if v[1] > now}
            self._cache[name] = (address, self._monotonic() + ttl)
            if not future.done():
                future.set_result(address)

        def work() -> None:
            address = self._lookup(name)
            try:
                loop.call_soon_threadsafe(settle, address)
            except RuntimeError:
                pass  # the loop is gone: the agent stopped

        # A daemon thread, not an executor: a lookup hanging in the C library must not hold
        # up the agent's exit.
        threading.Thread(target=work, name="peer dns", daemon=True).start()
        return future
