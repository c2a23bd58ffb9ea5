"""The agent accepts a placement only when it is newer than the one accepted last (agent/placement.py):
a higher ``seq``, or the very same message again (an agent restart); it refuses placements issued
in the future or valid too long, ignores an empty retained message, and at start hands its
stored placement to the launcher when the broker retains none."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import pytest

from agent.placement import ACCEPTED_FILE, PLACEMENT_FILE, PlacementSubscriber
from hulk.wire.broker import parse_broker_url, placement_topic
from hulk.wire.placement import MAX_CLOCK_AHEAD_MS, MAX_VALIDITY_MS, NodePlacement, Role
from tests.helpers.signing import SIGNER, T0, VERIFIER
from tests.helpers.waits import wait_until_async

HOUR = 3_600_000
TOPIC = placement_topic("lab", "n1")


def role(job: str) -> Role:
    return Role(plan_id="p", job=job, phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
                replica=0, num_replicas=1, rank=0, world_size=1, rendezvous_address="127.0.0.1",
                rendezvous_port=29500, micro_batch=1, command=("python", "-c", "pass"))


def signed(job: str | None, *, seq: int, issued: int = T0, valid_ms: int = HOUR,
           plan_id: str = "p1") -> bytes:
    bare = NodePlacement(fleet="lab", node="n1", plan_id=plan_id,
                         roles=(role(job),) if job else ())
    return bare.signed(SIGNER, issued_at_ms=issued, expires_at_ms=issued + valid_ms,
                       seq=seq).to_bytes()


def subscriber(state_dir, changes: list | None = None, *, now: int = T0, **kwargs) -> PlacementSubscriber:
    return PlacementSubscriber(parse_broker_url("mqtt://127.0.0.1:1"), fleet="lab", node_id="n1",
                               state_dir=state_dir, verifier=VERIFIER, clock_ms=lambda: now,
                               on_change=None if changes is None else changes.append, **kwargs)


async def test_a_higher_seq_is_accepted_an_older_one_refused(tmp_path):
    changes: list = []
    sub = subscriber(tmp_path, changes)
    await sub.handle(TOPIC, signed("a", seq=10))
    await sub.handle(TOPIC, signed("b", seq=11))
    assert [c.roles[0].job for c in changes] == ["a", "b"] and sub.ignored == 0
    await sub.handle(TOPIC, signed("c", seq=9))            # older, though issued later
    assert sub.ignored == 1 and sub.current.roles[0].job == "b"
    assert json.loads((tmp_path / ACCEPTED_FILE).read_text())["seq"] == 11


async def test_the_same_message_is_accepted_after_a_restart_another_with_its_seq_is_not(tmp_path, caplog):
    first = subscriber(tmp_path)
    current = signed("a", seq=20)
    await first.handle(TOPIC, current)
    changes: list = []
    restarted = subscriber(tmp_path, changes)
    # Same seq, other content (another job, or the same one signed again): a replay.
    await restarted.handle(TOPIC, signed("b", seq=20))
    await restarted.handle(TOPIC, signed("a", seq=20, issued=T0 + 1))
    assert restarted.ignored == 2 and changes == []
    assert sum("replayed" in r.getMessage() for r in caplog.records) == 2
    await restarted.handle(TOPIC, current)                 # the retained one: accepted again
    assert restarted.ignored == 2 and [c.seq for c in changes] == [20]


async def test_a_finished_jobs_placement_replayed_after_its_clear_is_refused(tmp_path):
    """The issue's replay: the job's own signed message, published again after the node was
    cleared, runs nothing; the clear (a signed placement without roles) removes the file."""
    changes: list = []
    sub = subscriber(tmp_path, changes)
    job = signed("train", seq=100)
    await sub.handle(TOPIC, job)
    await sub.handle(TOPIC, signed(None, seq=101, plan_id="cleared"))
    assert changes[-1].roles == () and not (tmp_path / PLACEMENT_FILE).exists()
    for again in (sub, subscriber(tmp_path, changes)):     # also after a restart
        await again.handle(TOPIC, job)
        assert again.ignored == 1
    assert [len(c.roles) for c in changes] == [1, 0]


@pytest.mark.parametrize("issued, valid_ms, reason", [
    (T0 + MAX_CLOCK_AHEAD_MS + 1, HOUR, "issued in the future"),
    (253_402_300_799_000, HOUR, "issued in the future"),                 # year 9999
    (T0, MAX_VALIDITY_MS + 1, "valid too long"),
    (T0 - 1000, 10**15, "valid too long"),
])
async def test_placements_issued_in_the_future_or_valid_too_long_are_refused(tmp_path, caplog, issued,
                                                                              valid_ms, reason):
    sub = subscriber(tmp_path)
    await sub.handle(TOPIC, signed("far", seq=issued, issued=issued, valid_ms=valid_ms))
    assert sub.ignored == 1 and sub.current is None and not (tmp_path / ACCEPTED_FILE).exists()
    assert any(reason in r.getMessage() for r in caplog.records)
    # Nothing was recorded: the planner's next placement is accepted.
    await sub.handle(TOPIC, signed("now", seq=T0))
    assert sub.current is not None and sub.current.roles[0].job == "now"


async def test_at_the_limits_placements_are_accepted(tmp_path):
    sub = subscriber(tmp_path)
    await sub.handle(TOPIC, signed("edge", seq=1, issued=T0 + MAX_CLOCK_AHEAD_MS,
                                   valid_ms=MAX_VALIDITY_MS))
    assert sub.ignored == 0 and sub.current.seq == 1


async def test_an_old_format_mark_reads_as_seq_0(tmp_path):
    (tmp_path / ACCEPTED_FILE).write_text(json.dumps({"issued_at_ms": T0 + HOUR, "plan_id": "p9"}))
    sub = subscriber(tmp_path)
    await sub.handle(TOPIC, signed("old", seq=0))          # a planner without sequences
    assert sub.ignored == 1
    await sub.handle(TOPIC, signed("new", seq=1))          # anything signed with a seq is newer
    assert sub.ignored == 1 and sub.current.roles[0].job == "new"
    assert json.loads((tmp_path / ACCEPTED_FILE).read_text())["seq"] == 1


async def test_an_empty_message_is_logged_and_ignored(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="agent.placement")
    changes: list = []
    sub = subscriber(tmp_path, changes)
    await sub.handle(TOPIC, signed("a", seq=5))
    stored = (tmp_path / PLACEMENT_FILE).read_bytes()
    for _ in range(3):
        await sub.handle(TOPIC, b"")
    assert len(changes) == 1 and sub.current.roles[0].job == "a"
    assert (tmp_path / PLACEMENT_FILE).read_bytes() == stored
    logged = [r.getMessage() for r in caplog.records if "was deleted" in r.getMessage()]
    assert logged == ["the retained placement was deleted; keeping the current one until the "
                      "planner sends a signed placement"]


class _Down:
    """A broker client that never connects."""

    def __init__(self, *args, **kwargs):
        pass

    async def __aenter__(self):
        raise OSError("connection refused")

    async def __aexit__(self, *exc):
        return False


async def _run_until(sub: PlacementSubscriber, predicate) -> None:
    task = asyncio.create_task(sub.run())
    try:
        await wait_until_async(predicate, 10, "the start-up hand-over")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_with_no_retained_placement_the_stored_one_goes_to_the_launcher(tmp_path):
    await subscriber(tmp_path).handle(TOPIC, signed("a", seq=30))
    changes: list = []
    sub = subscriber(tmp_path, changes, client_factory=_Down, retained_wait_s=0.01,
                     backoff_initial_s=0.01)
    await _run_until(sub, lambda: changes)
    assert [c.seq for c in changes] == [30] and sub.current.seq == 30
    assert (tmp_path / PLACEMENT_FILE).exists()


async def test_with_no_retained_placement_and_no_file_the_launcher_gets_none_once(tmp_path):
    changes: list = []
    sub = subscriber(tmp_path, changes, client_factory=_Down, retained_wait_s=0.01,
                     backoff_initial_s=0.01)
    await _run_until(sub, lambda: changes)
    assert changes == [None]


async def test_a_stored_placement_that_no_longer_verifies_is_not_acted_on(tmp_path):
    await subscriber(tmp_path).handle(TOPIC, signed("a", seq=30, valid_ms=1000))
    changes: list = []
    sub = subscriber(tmp_path, changes, now=T0 + 2000, client_factory=_Down,
                     retained_wait_s=0.01, backoff_initial_s=0.01)    # expired meanwhile
    await _run_until(sub, lambda: changes)
    assert changes == [None]
