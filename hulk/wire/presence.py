"""serve's presence on the broker: ``hulk/v1/<fleet>/planner/presence``, retained, signed.

serve keeps one broker connection (planner/service/broker_session.py). On connecting it sets a
last will, ``offline`` for that session, and publishes ``online``; it publishes ``offline`` itself
before a clean stop. The broker so retains ``offline`` whenever serve's session is gone, however
it went. An agent that cannot reach serve reads the retained message again (agent/presence.py):
while it says ``offline`` no serve can re-place this node's jobs (a serve counts a node silent
only a full node timeout after its own ``online`` was acknowledged), so the node's lease may be
extended from the time of that read. ``session_ms`` (when the session connected, serve's clock)
orders sessions: an ``offline`` of a session older than one already seen is stale.

Only the planner's broker account may write the topic (planner/security/broker_accounts.py), and
the message is signed with the placement key, so neither a node account nor a forger can fake it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hulk.errors import InputError
from hulk.wire.broker import check_name

PRESENCE_FORMAT = "hulk-presence/1"
ONLINE, OFFLINE = "online", "offline"
MAX_PRESENCE_BYTES = 4096
_FIELDS = {"format", "fleet", "state", "session_ms", "signature"}


def presence_topic(fleet: str) -> str:
    return f"hulk/v1/{check_name(fleet, 'fleet')}/planner/presence"


@dataclass(frozen=True)
class Presence:
    fleet: str
    state: str          # ONLINE or OFFLINE
    session_ms: int     # when serve's session connected (its wall clock, ms)

    def document(self) -> dict[str, Any]:
        """The unsigned document (the signer adds ``signature``)."""
        return {"format": PRESENCE_FORMAT, "fleet": self.fleet, "state": self.state,
                "session_ms": self.session_ms}


def presence_bytes(signed: dict[str, Any]) -> bytes:
    return json.dumps(signed, sort_keys=True, separators=(",", ":")).encode()


def parse_presence(payload: bytes | str, *, verifier: Any, source: str) -> Presence:
    """A verified presence message; InputError (one line) on anything else."""
    if isinstance(payload, str):
        payload = payload.encode()
    if len(payload) > MAX_PRESENCE_BYTES:
        raise InputError(f"expected at most {MAX_PRESENCE_BYTES} bytes, got {len(payload)}",
                         path=source)
    try:
        value = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise InputError("expected a JSON presence message", path=source) from None
    if not isinstance(value, dict) or set(value) != _FIELDS:
        raise InputError(f"expected an object with exactly {sorted(_FIELDS)}", path=source)
    if value["format"] != PRESENCE_FORMAT:
        raise InputError(f"expected {PRESENCE_FORMAT!r}, got {value['format']!r}", path=source,
                         field="format")
    if value["state"] not in (ONLINE, OFFLINE):
        raise InputError(f"expected {ONLINE!r} or {OFFLINE!r}", path=source, field="state")
    session = value["session_ms"]
    if not isinstance(session, int) or isinstance(session, bool) or not 0 < session < 2**63:
        raise InputError("expected a positive integer", path=source, field="session_ms")
    if not isinstance(value["fleet"], str):
        raise InputError("expected a fleet name", path=source, field="fleet")
    if verifier is None:
        raise InputError("no placement_key is configured: presence cannot be verified",
                         path=source)
    verifier.verify(value, source=source)
    return Presence(fleet=value["fleet"], state=value["state"], session_ms=session)
