"""The agent's reading of serve's presence: which answers renew the node lease, from when."""

from __future__ import annotations

import json

from agent.lease import NodeLease
from agent.presence import PlannerWatch
from hulk.wire.presence import OFFLINE, ONLINE, Presence, parse_presence, presence_bytes
from hulk.wire.signing import Signer

SIGNER = Signer.generate()


def message(state: str, session_ms: int = 1_000, *, signer: Signer = SIGNER,
            fleet: str = "lab") -> bytes:
    return presence_bytes(signer.sign(Presence(fleet, state, session_ms).document()))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch(clock: Clock | None = None) -> tuple[PlannerWatch, list[float], Clock]:
    clock = clock or Clock()
    renewed: list[float] = []
    return PlannerWatch("lab", SIGNER.verifier(), renew=renewed.append, clock=clock), renewed, clock


def test_an_offline_answer_renews_from_when_the_read_was_sent():
    w, renewed, clock = watch()
    w.asking()                       # sent at 100
    clock.now = 104.0                # answered later: the lease counts from the send
    assert w.handle(message(OFFLINE), retained=True)
    assert renewed == [100.0]
    assert w.offline and w.asked_at is None


def test_online_answers_and_live_messages_renew_nothing():
    w, renewed, _ = watch()
    w.asking()
    assert w.handle(message(ONLINE), retained=True)
    w.handle(message(OFFLINE), retained=False)       # a live publish answers no read
    assert renewed == [] and w.offline
    assert w.asked_at is None


def test_no_answer_without_an_outstanding_read():
    w, renewed, _ = watch()
    assert not w.handle(message(OFFLINE), retained=True)
    assert renewed == []


def test_an_older_sessions_offline_is_stale():
    w, renewed, _ = watch()
    w.handle(message(ONLINE, session_ms=2_000), retained=False)
    w.asking()
    assert w.handle(message(OFFLINE, session_ms=1_000), retained=True)
    assert renewed == [] and w.state == ONLINE


def test_forged_misaddressed_and_malformed_messages_are_ignored_but_answer_the_read():
    for payload in (message(OFFLINE, signer=Signer.generate()), message(OFFLINE, fleet="other"),
                    b"", b"{", b"x" * 10_000,
                    json.dumps({**json.loads(message(OFFLINE)), "state": "asleep"}).encode()):
        w, renewed, _ = watch()
        w.asking()
        assert w.handle(payload, retained=True)
        assert renewed == [] and w.state is None


def test_reset_drops_the_outstanding_read():
    w, renewed, _ = watch()
    w.asking()
    w.reset()                        # a new connection: the old read can no longer be answered
    assert not w.handle(message(OFFLINE), retained=True)
    assert renewed == []


def test_parse_refuses_unsigned_and_extra_fields():
    signed = json.loads(message(OFFLINE))
    for doc in ({k: v for k, v in signed.items() if k != "signature"}, {**signed, "extra": 1},
                {**signed, "session_ms": True}, {**signed, "session_ms": 0}):
        try:
            parse_presence(json.dumps(doc), verifier=SIGNER.verifier(), source="t")
        except Exception as exc:      # InputError, one line
            assert "\n" not in str(exc)
        else:
            raise AssertionError(f"accepted {doc}")


def test_a_witnessed_lease_never_shortens_a_later_heartbeats_deadline(tmp_path):
    clock = Clock()
    lease = NodeLease(tmp_path, clock=clock, lease_s=10.0)
    lease.granted(100.0, 10.0)
    deadline = lease.deadline
    lease.witnessed(90.0)            # an older read: would end sooner
    assert lease.deadline == deadline
    lease.witnessed(105.0)
    assert lease.deadline == 105.0 + lease.terms.renew_s
