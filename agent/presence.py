"""What the agent knows of serve's presence, and the lease it may take from the broker.

A node's lease (agent/lease.py) is renewed by heartbeats serve acknowledges. While serve is down
nothing acknowledges them, yet nothing can re-place the node's jobs either: a serve counts a
node silent only a full node timeout after its own ``online`` presence was acknowledged by the
broker (hulk/wire/presence.py). So while the broker says serve's session is ``offline``, the
agent re-reads that retained message (subscribing again makes the broker send it) and renews
the lease from the time it *sent* that request, exactly as for a heartbeat: the broker's answer
reflects its state at some moment after the send, and a serve that came online after that moment
waits a node timeout from then. One read is outstanding at a time on one connection, so an
answer is never taken for a later request's; a read left unanswered ends the connection.

The watch is pure logic over the messages the placement subscriber hands it; the subscriber
does the subscribing (agent/placement.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from hulk.errors import InputError
from hulk.wire.presence import OFFLINE, ONLINE, Presence, parse_presence, presence_topic

log = logging.getLogger(__name__)


class PlannerWatch:
    """serve's presence as this agent last read it, and the lease renewals it grants.

    ``renew(sent_at)`` is called (NodeLease.witnessed) for every answer that says ``offline``;
    ``clock`` is the lease's clock."""

    def __init__(self, fleet: str, verifier: Any, *, renew: Callable[[float], None] | None,
                 clock: Callable[[], float]):
        self.topic = presence_topic(fleet)
        self.fleet = fleet
        self.verifier = verifier
        self.renew = renew
        self.clock = clock
        self.state: str | None = None       # None: no presence read yet (an older serve)
        self.session_ms = 0                 # the newest session seen
        self.asked_at: float | None = None  # send time of the read awaiting its answer
        self.renewals = 0
        self._refused: set[str] = set()

    @property
    def offline(self) -> bool:
        return self.state == OFFLINE

    def asking(self) -> float:
        """A read of the retained presence is about to be sent (a SUBSCRIBE): its send time."""
        self.asked_at = self.clock()
        return self.asked_at

    def reset(self) -> None:
        """The connection ended: no answer to an earlier read can come any more."""
        self.asked_at = None

    def handle(self, payload: Any, retained: bool) -> bool:
        """One message on the presence topic; True when it answered the outstanding read."""
        try:
            presence = parse_presence(payload if isinstance(payload, (bytes, str)) else b"",
                                      verifier=self.verifier, source=self.topic)
            if presence.fleet != self.fleet:
                raise InputError(f"expected fleet {self.fleet!r}, got {presence.fleet!r}",
                                 path=self.topic, field="fleet")
        except InputError as exc:
            if str(exc) not in self._refused:    # the broker repeats a retained one: log once
                self._refused.add(str(exc))
                log.warning("ignoring serve's presence message: %s", exc)
            return self._answered(retained, None)
        if presence.session_ms < self.session_ms:
            log.info("ignoring a presence of an older serve session (%d < %d)",
                     presence.session_ms, self.session_ms)
            return self._answered(retained, None)
        if presence.state != self.state:
            log.info("serve is %s (session %d)%s", presence.state, presence.session_ms,
                     ": the node lease is renewed from the broker while it stays so"
                     if presence.state == OFFLINE else "")
        self.session_ms, self.state = presence.session_ms, presence.state
        return self._answered(retained, presence)

    def _answered(self, retained: bool, presence: Presence | None) -> bool:
        # Only a retained message answers a read: the broker sends the ones it holds on a new
        # subscription, and forwards live publishes with the retain flag cleared.
        if not retained or self.asked_at is None:
            return False
        asked, self.asked_at = self.asked_at, None
        if presence is not None and presence.state == OFFLINE and self.renew is not None:
            self.renewals += 1
            self.renew(asked)
        return True


__all__ = ["PlannerWatch", "ONLINE", "OFFLINE"]
