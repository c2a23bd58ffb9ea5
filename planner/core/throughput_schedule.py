"""Which throughput tests run next: exclusive test slots between site representatives (pure).

A throughput test sends ``streams`` parallel TCP streams from a server of one site (the sender)
to a server of another for ``duration_s`` seconds (or between two servers of one site, when
``intra_site``). Every directed site pair is due once per ``period_s``; :func:`schedule` plans the
due pairs, most overdue first, into slots of ``slot_s`` seconds on a fixed grid of unix time in
``[now + lead_s, now + lead_s + horizon_s)``:

* a test fits inside its slot (the receiver is closed by ``ThroughputSlot.end_ms``), and no node
  is in two tests of one slot: slots never overlap, so no node is ever in two tests at once,
  provided serve plans each slot once (calls at most once per ``horizon_s``) or tells it, in
  ``busy_until``, when each node's tests already planned end: a node is then planned only into
  slots starting after that, so it goes on testing in the next slots instead of idling;
* servers of running jobs (``busy``) take no part unless ``allow_busy``;
* the sender and receiver are drawn from the site's free candidates with ``rng``, so the
  representatives rotate and one broken server cannot block a pair for ever;
* a pair's due time is its last test plus the period less a slip in ``[0, slip_s)`` that the pair
  and its last test fix (a hash): pairs spread out instead of falling due together, and the period
  stays an upper bound on the time between two tests of a pair that the fleet has room for;
* each test is expected to move ``expected_gbps`` (10 Gbit/s when unknown) for its duration, and
  planning stops when today's spent bytes plus the planned ones would pass the daily budget.

``rng`` also draws test ids and one-time secrets: serve passes ``random.SystemRandom()``; tests pass
a seeded ``random.Random`` and get the same plan for the same seed.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence, Set as AbstractSet
from dataclasses import dataclass

from hulk.errors import InputError
from hulk.wire.throughput import (CONNECT_DELAY_MS, GRACE_MS, MAX_DURATION_S, MAX_STREAMS,
                                  MIN_DURATION_S, SECRET_BYTES, ThroughputSlot)

DEFAULT_GBPS = 10.0          # a pair never measured is planned as if it moved this much


@dataclass(frozen=True)
class ScheduleOptions:
    period_s: float = 6 * 3600        # every directed site pair tested at least once per period
    slip_s: float = 600               # a pair falls due up to this long before its period ends
    duration_s: float = 3.0
    streams: int = 4
    slot_s: float = 15.0              # one slot holds many disjoint tests; a test fits in one
    lead_s: float = 30.0              # slots start this far ahead (agents learn them by heartbeat)
    daily_budget_bytes: float = 200e9  # fleet-wide bytes a day for throughput tests
    allow_busy: bool = False          # tests may use servers of running jobs
    intra_site: bool = True           # also test between two servers of a site with >= 2

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, expected: str) -> None:
            if not ok:
                raise InputError(f"expected {expected}, got {getattr(self, name)!r}",
                                 field=f"throughput.{name}")
        need(_finite(self.period_s) and self.period_s > 0, "period_s", "seconds > 0")
        need(_finite(self.slip_s) and 0 <= self.slip_s < self.period_s, "slip_s",
             "seconds in [0, period_s)")
        need(_finite(self.duration_s) and MIN_DURATION_S < self.duration_s <= MAX_DURATION_S,
             "duration_s", f"seconds in ({MIN_DURATION_S:g}, {MAX_DURATION_S:g}]")
        need(isinstance(self.streams, int) and 1 <= self.streams <= MAX_STREAMS, "streams",
             f"a whole number in [1, {MAX_STREAMS}]")
        need(_finite(self.slot_s) and self.slot_s * 1000 >= test_span_ms(self.duration_s),
             "slot_s", f"seconds >= the test's span ({test_span_ms(self.duration_s) / 1000:g} s)")
        need(_finite(self.lead_s) and self.lead_s >= 0, "lead_s", "seconds >= 0")
        need(_finite(self.daily_budget_bytes) and self.daily_budget_bytes >= 0,
             "daily_budget_bytes", "bytes >= 0")


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def test_span_ms(duration_s: float) -> int:
    """How long a test holds its two servers: from the receiver's start to its close."""
    return CONNECT_DELAY_MS + round(duration_s * 1000) + GRACE_MS


@dataclass(frozen=True)
class Candidate:
    """A server that takes throughput tests (it registered a throughput port)."""

    node_id: str
    site: str
    address: str
    port: int

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 1 <= self.port <= 65535:
            raise InputError(f"expected a port in [1, 65535], got {self.port!r}",
                             field=f"candidate {self.node_id}.port")
        if not self.address:
            raise InputError("expected an address", field=f"candidate {self.node_id}.address")


@dataclass(frozen=True)
class PairState:
    last_ms: int | None               # last test start of this directed site pair (None: never)
    due_ms: int                       # when the pair is due again (see next_due)


@dataclass(frozen=True)
class PlannedTest:
    test_id: str
    src_site: str
    dst_site: str
    sender: Candidate
    receiver: Candidate
    start_ms: int
    duration_s: float
    streams: int
    secret: bytes
    expected_bytes: float

    @property
    def end_ms(self) -> int:
        return self.start_ms + test_span_ms(self.duration_s)


def slip_fraction(pair: tuple[str, str], last_ms: int) -> float:
    """A number in [0, 1) that looks random but is fixed by the pair and its last test."""
    digest = hashlib.blake2b(f"{pair[0]}\0{pair[1]}\0{last_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2 ** 64


def next_due(pair: tuple[str, str], last_ms: int | None, options: ScheduleOptions) -> PairState:
    """When ``pair`` is due: never tested, at once (0); else its period less its slip after its
    last test."""
    if last_ms is None:
        return PairState(None, 0)
    slip_ms = slip_fraction(pair, last_ms) * options.slip_s * 1000
    return PairState(last_ms, int(last_ms + options.period_s * 1000 - slip_ms))


def site_pairs(by_site: Mapping[str, Sequence[Candidate]],
               intra_site: bool) -> list[tuple[str, str]]:
    """Every directed pair of sites with candidates, and (site, site) for sites of >= 2."""
    sites = sorted(by_site)
    pairs = [(a, b) for a in sites for b in sites if a != b]
    if intra_site:
        pairs += [(s, s) for s in sites if len(by_site[s]) >= 2]
    return pairs


def slot_starts(now_ms: int, options: ScheduleOptions, horizon_s: float) -> list[int]:
    """The grid slots (multiples of ``slot_s`` in unix time) starting in the planning window."""
    slot_ms = round(options.slot_s * 1000)
    first = now_ms + round(options.lead_s * 1000)
    end = first + round(horizon_s * 1000)
    start = -(-first // slot_ms) * slot_ms
    return list(range(start, end, slot_ms)) if start < end else []


def schedule(candidates: Sequence[Candidate], last_tested_ms: Mapping[tuple[str, str], int],
             busy: AbstractSet[str], now_ms: int, options: ScheduleOptions, *,
             rng: random.Random, spent_today_bytes: float = 0.0,
             expected_gbps: Mapping[tuple[str, str], float] | None = None,
             horizon_s: float = 60.0,
             busy_until: Mapping[str, int] | None = None) -> list[PlannedTest]:
    """The tests to run in the slots of ``[now + lead, now + lead + horizon)`` (see the module).
    ``busy_until``: node -> unix ms until which it is held (by tests planned before)."""
    held = busy_until or {}
    by_site: dict[str, list[Candidate]] = {}
    seen: set[str] = set()
    for cand in sorted(candidates, key=lambda c: c.node_id):
        if cand.node_id in seen:
            raise InputError(f"node {cand.node_id} is listed twice", field="candidates")
        seen.add(cand.node_id)
        by_site.setdefault(cand.site, []).append(cand)
    pairs = site_pairs(by_site, options.intra_site)
    rng.shuffle(pairs)   # ties in due time go in random order
    states = {p: next_due(p, last_tested_ms.get(p), options) for p in pairs}
    pairs.sort(key=lambda p: states[p].due_ms)
    slots = slot_starts(now_ms, options, horizon_s)
    slot_ms = round(options.slot_s * 1000)
    # A node held by earlier tests until ``until`` is used in every slot starting by then.
    used: dict[int, set[str]] = {s: {n for n, until in held.items() if until >= s} for s in slots}
    planned: list[PlannedTest] = []
    planned_bytes = 0.0
    for pair in pairs:
        due = states[pair].due_ms
        gbps = (expected_gbps or {}).get(pair, DEFAULT_GBPS)
        expected = gbps * 1e9 * options.duration_s / 8
        for start in slots:
            if due >= start + slot_ms:
                continue
            senders = _free(by_site[pair[0]], used[start], busy, options.allow_busy)
            if not senders:
                continue
            sender = rng.choice(senders)
            receivers = [c for c in _free(by_site[pair[1]], used[start], busy, options.allow_busy)
                         if c.node_id != sender.node_id]
            if not receivers:
                continue
            if spent_today_bytes + planned_bytes + expected > options.daily_budget_bytes:
                return planned
            receiver = rng.choice(receivers)
            used[start].update((sender.node_id, receiver.node_id))
            planned_bytes += expected
            planned.append(PlannedTest(
                test_id=f"{rng.getrandbits(128):032x}", src_site=pair[0], dst_site=pair[1],
                sender=sender, receiver=receiver, start_ms=start, duration_s=options.duration_s,
                streams=options.streams, secret=rng.randbytes(SECRET_BYTES),
                expected_bytes=expected))
            break
    return planned


def _free(members: Sequence[Candidate], used: AbstractSet[str], busy: AbstractSet[str],
          allow_busy: bool) -> list[Candidate]:
    return [c for c in members
            if c.node_id not in used and (allow_busy or c.node_id not in busy)]


def slots_for(test: PlannedTest) -> tuple[ThroughputSlot, ThroughputSlot]:
    """The (send, receive) slots the sender's and the receiver's agents get."""
    common = dict(test_id=test.test_id, port=test.receiver.port, start_ms=test.start_ms,
                  duration_s=test.duration_s, streams=test.streams, secret=test.secret)
    send = ThroughputSlot(role="send", peer_id=test.receiver.node_id,
                          peer_address=test.receiver.address, **common)
    receive = ThroughputSlot(role="receive", peer_id=test.sender.node_id,
                             peer_address=test.sender.address, **common)
    return send, receive
