"""The throughput-test scheduler: exclusive slots, coverage within the period, budget, busy nodes,
rotating representatives, seeded randomness (seeded random fleets and simulated days)."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from hulk.errors import InputError
from planner.core.throughput_schedule import (Candidate, PlannedTest, ScheduleOptions, next_due,
                                              schedule, site_pairs, slots_for)

T0 = 1_764_000_000_000
HORIZON_S = 60.0


def fleet(rng: random.Random, sites: int, most: int) -> list[Candidate]:
    out = []
    for s in range(sites):
        for k in range(rng.randint(1, most)):
            out.append(Candidate(f"s{s}n{k}", f"site{s}", f"10.0.{s}.{k + 1}", 7000 + k))
    return out


def simulate(cands: list[Candidate], options: ScheduleOptions, seconds: float, *, seed: int,
             busy_of=lambda now_ms: frozenset(), budget_reset: bool = True) -> list[PlannedTest]:
    """Serve's loop: one call per horizon, the last test of each pair fed back."""
    rng = random.Random(seed)
    last: dict[tuple[str, str], int] = {}
    done: list[PlannedTest] = []
    spent, day = 0.0, 0
    now = T0
    while now < T0 + seconds * 1000:
        if budget_reset and (now - T0) // 86_400_000 != day:
            day, spent = (now - T0) // 86_400_000, 0.0
        tests = schedule(cands, last, busy_of(now), now, options, rng=rng,
                         spent_today_bytes=spent, horizon_s=HORIZON_S)
        for t in tests:
            last[(t.src_site, t.dst_site)] = t.start_ms
            spent += t.expected_bytes
        done.extend(tests)
        now += round(HORIZON_S * 1000)
    return done


def assert_no_node_in_two_tests_at_once(tests: list[PlannedTest]) -> None:
    spans = defaultdict(list)
    for t in tests:
        assert t.sender.node_id != t.receiver.node_id
        for node in (t.sender.node_id, t.receiver.node_id):
            spans[node].append((t.start_ms, t.end_ms))
    for node, items in spans.items():
        items.sort()
        for (s1, e1), (s2, _) in zip(items, items[1:]):
            assert e1 < s2, f"{node} is in two tests at once: [{s1}, {e1}] and from {s2}"


def test_no_node_is_ever_in_two_tests_whose_spans_overlap():
    rng = random.Random(26)
    for case in range(12):
        cands = fleet(rng, rng.randint(2, 6), rng.randint(1, 4))
        options = ScheduleOptions(period_s=900, slip_s=120, daily_budget_bytes=1e18)
        tests = simulate(cands, options, 3600, seed=case)
        assert tests, "a fleet of two sites or more has tests to run"
        assert_no_node_in_two_tests_at_once(tests)


def test_every_directed_site_pair_is_covered_within_its_period():
    rng = random.Random(7)
    for case in range(6):
        cands = fleet(rng, rng.randint(2, 5), 4)
        by_site = defaultdict(list)
        for c in cands:
            by_site[c.site].append(c)
        pairs = site_pairs(by_site, intra_site=True)
        assert any(a == b for a, b in pairs) and any(a != b for a, b in pairs)
        options = ScheduleOptions(period_s=1800, slip_s=300, daily_budget_bytes=1e18)
        tests = simulate(cands, options, 4 * 1800, seed=case)
        starts = defaultdict(list)
        for t in tests:
            starts[(t.src_site, t.dst_site)].append(t.start_ms)
            assert t.sender.site == t.src_site and t.receiver.site == t.dst_site
        assert set(starts) == set(pairs)
        end = T0 + 4 * 1800 * 1000
        for pair in pairs:
            times = [T0] + sorted(starts[pair])
            gaps = [b - a for a, b in zip(times, times[1:])]
            assert max(gaps) <= 1800 * 1000, (pair, gaps)
            # not tested much more often than needed: the slip only shortens a period
            assert min(gaps[1:]) >= (1800 - 300) * 1000, (pair, gaps)
            assert end - times[-1] <= 1800 * 1000


def test_intra_site_pairs_only_when_on_and_the_site_has_two_servers():
    cands = [Candidate("a1", "A", "10.0.0.1", 1), Candidate("a2", "A", "10.0.0.2", 1),
             Candidate("b1", "B", "10.0.1.1", 1)]
    options = ScheduleOptions(daily_budget_bytes=1e18, intra_site=False)
    tests = schedule(cands, {}, frozenset(), T0, options, rng=random.Random(1), horizon_s=600)
    assert {(t.src_site, t.dst_site) for t in tests} == {("A", "B"), ("B", "A")}
    on = schedule(cands, {}, frozenset(), T0, ScheduleOptions(daily_budget_bytes=1e18),
                  rng=random.Random(1), horizon_s=600)
    assert {(t.src_site, t.dst_site) for t in on} == {("A", "B"), ("B", "A"), ("A", "A")}


def test_the_daily_budget_is_never_exceeded():
    rng = random.Random(3)
    cands = fleet(rng, 6, 3)
    gbps = {("site0", "site1"): 0.5}
    for budget, spent in [(0.0, 0.0), (4e9, 0.0), (20e9, 5e9), (50e9, 49e9), (1e12, 0.0)]:
        options = ScheduleOptions(daily_budget_bytes=budget)
        tests = schedule(cands, {}, frozenset(), T0, options, rng=random.Random(2),
                         spent_today_bytes=spent, expected_gbps=gbps, horizon_s=600)
        planned = sum(t.expected_bytes for t in tests)
        assert spent + planned <= budget
        for t in tests:
            assert t.expected_bytes == gbps.get((t.src_site, t.dst_site), 10.0) * 3.0e9 / 8
    # room for exactly two tests at the default 10 Gbit/s (3.75 GB each)
    tests = schedule(cands, {}, frozenset(), T0, ScheduleOptions(daily_budget_bytes=7.6e9),
                     rng=random.Random(2), horizon_s=600)
    assert len(tests) == 2


def test_busy_servers_are_skipped_unless_allowed():
    cands = [Candidate(f"{s}{k}", s, f"10.0.{i}.{k}", 9000) for i, s in enumerate("ABC")
             for k in range(3)]
    busy = frozenset({"A0", "A1", "B2", "C0"})
    tests = schedule(cands, {}, busy, T0, ScheduleOptions(daily_budget_bytes=1e18),
                     rng=random.Random(5), horizon_s=300)
    assert tests
    assert not busy & {n for t in tests for n in (t.sender.node_id, t.receiver.node_id)}
    allowed = schedule(cands, {}, busy, T0,
                       ScheduleOptions(daily_budget_bytes=1e18, allow_busy=True),
                       rng=random.Random(5), horizon_s=300)
    assert busy & {n for t in allowed for n in (t.sender.node_id, t.receiver.node_id)}
    # a site whose servers are all busy is not tested at all
    all_busy = frozenset({"A0", "A1", "A2"})
    tests = schedule(cands, {}, all_busy, T0, ScheduleOptions(daily_budget_bytes=1e18),
                     rng=random.Random(5), horizon_s=300)
    assert tests and all("A" not in (t.src_site, t.dst_site) for t in tests)


def test_a_node_held_by_earlier_tests_gets_the_slots_after_them():
    cands = [Candidate("a", "A", "10.0.0.1", 9000), Candidate("b", "B", "10.0.1.1", 9000)]
    options = ScheduleOptions(daily_budget_bytes=1e18)
    first = schedule(cands, {}, frozenset(), T0, options, rng=random.Random(1), horizon_s=15)
    [held] = first                        # one slot: one of the two pairs, both nodes in it
    until = {"a": held.end_ms, "b": held.end_ms}
    # The next round, 5 s on: the slot after the held one, for the other pair.
    last = {(held.src_site, held.dst_site): held.start_ms}
    [after] = schedule(cands, last, frozenset(), T0 + 5_000, options, rng=random.Random(2),
                       horizon_s=15, busy_until=until)
    assert after.start_ms == held.start_ms + 15_000
    assert {(held.src_site, held.dst_site), (after.src_site, after.dst_site)} == {("A", "B"),
                                                                                   ("B", "A")}
    # In one round: both pairs, one slot after the other; never in a slot the node holds.
    both = schedule(cands, {}, frozenset(), T0, options, rng=random.Random(1), horizon_s=60,
                    busy_until={"a": T0 + 45_000})
    assert sorted(t.start_ms for t in both) == [T0 + 60_000, T0 + 75_000]
    # A job's servers stay out whatever they hold.
    assert schedule(cands, {}, frozenset({"a"}), T0, options, rng=random.Random(1),
                    busy_until={"a": T0}) == []


def test_planning_every_few_seconds_with_held_nodes_never_overlaps_and_covers_sooner():
    """Serve's loop: a call every 5 s, each node's planned tests fed back as busy_until."""
    rng = random.Random(99)
    for case in range(8):
        cands = fleet(rng, rng.randint(2, 6), rng.randint(1, 3))
        options = ScheduleOptions(period_s=900, slip_s=120, daily_budget_bytes=1e18)
        plan_rng = random.Random(case)
        last: dict[tuple[str, str], int] = {}
        done: list[PlannedTest] = []
        for now in range(T0, T0 + 1800 * 1000, 5_000):
            until: dict[str, int] = {}
            for t in done:
                if t.end_ms > now:
                    for node in (t.sender.node_id, t.receiver.node_id):
                        until[node] = max(until.get(node, 0), t.end_ms)
            tests = schedule(cands, last, frozenset(), now, options, rng=plan_rng,
                             horizon_s=HORIZON_S, busy_until=until)
            for t in tests:
                last[(t.src_site, t.dst_site)] = t.start_ms
            done.extend(tests)
        assert_no_node_in_two_tests_at_once(done)
        by_site = defaultdict(list)
        for c in cands:
            by_site[c.site].append(c)
        pairs = site_pairs(by_site, intra_site=True)
        first = {}
        for t in done:
            first.setdefault((t.src_site, t.dst_site), t.start_ms)
        assert set(first) == set(pairs)
        # Each pair needs two servers for one slot; with no idle slots between a node's tests,
        # every pair is tested within (pairs + 1) slots after the lead.
        assert max(first.values()) <= T0 + 30_000 + (len(pairs) + 1) * 15_000, case


def test_slots_start_after_the_lead_within_the_horizon_on_the_grid():
    rng = random.Random(11)
    cands = fleet(rng, 5, 3)
    options = ScheduleOptions(daily_budget_bytes=1e18)
    for now in (T0, T0 + 1, T0 + 7_499, T0 + 14_999):
        tests = schedule(cands, {}, frozenset(), now, options, rng=random.Random(1))
        assert tests
        for t in tests:
            assert now + 30_000 <= t.start_ms < now + 30_000 + 60_000
            assert t.start_ms % 15_000 == 0
            assert t.end_ms <= t.start_ms + 15_000


def test_slip_is_spread_within_the_slip_and_fixed_by_pair_and_last_test():
    options = ScheduleOptions(period_s=3600, slip_s=600)
    offsets = []
    for k in range(200):
        state = next_due((f"s{k}", "t"), T0, options)
        offsets.append(T0 + 3_600_000 - state.due_ms)
        assert state == next_due((f"s{k}", "t"), T0, options)
    assert all(0 <= o <= 600_000 for o in offsets)
    assert min(offsets) < 60_000 and max(offsets) > 540_000
    assert len(set(offsets)) > 190
    assert next_due(("a", "b"), None, options).due_ms == 0


def test_the_most_overdue_pair_goes_first():
    cands = [Candidate("a", "A", "10.0.0.1", 1), Candidate("b", "B", "10.0.0.2", 1)]
    options = ScheduleOptions(period_s=3600, slip_s=0, daily_budget_bytes=1e18)
    last = {("A", "B"): T0 - 5_000_000, ("B", "A"): T0 - 9_000_000}
    # one slot in the horizon: both pairs need the same two servers, only one can run
    tests = schedule(cands, last, frozenset(), T0, options, rng=random.Random(0), horizon_s=15)
    assert [(t.src_site, t.dst_site) for t in tests] == [("B", "A")]
    # pairs not due yet are not planned
    fresh = {("A", "B"): T0, ("B", "A"): T0}
    assert schedule(cands, fresh, frozenset(), T0, options, rng=random.Random(0)) == []


def test_representatives_rotate_among_a_sites_servers():
    cands = [Candidate(f"{s}{k}", s, f"10.0.{i}.{k}", 9000) for i, s in enumerate("AB")
             for k in range(3)]
    options = ScheduleOptions(period_s=600, slip_s=60, daily_budget_bytes=1e18,
                              intra_site=False)
    tests = [t for t in simulate(cands, options, 6 * 3600, seed=4) if t.src_site == "A"]
    assert {t.sender.node_id for t in tests} == {"A0", "A1", "A2"}
    assert {t.receiver.node_id for t in tests} == {"B0", "B1", "B2"}


def test_the_same_seed_gives_the_same_plan():
    cands = fleet(random.Random(9), 5, 3)
    options = ScheduleOptions(daily_budget_bytes=1e18)
    one = schedule(cands, {}, frozenset(), T0, options, rng=random.Random(42))
    two = schedule(list(reversed(cands)), {}, frozenset(), T0, options, rng=random.Random(42))
    other = schedule(cands, {}, frozenset(), T0, options, rng=random.Random(43))
    assert one == two
    assert {t.test_id for t in one}.isdisjoint(t.test_id for t in other)
    assert len({t.secret for t in one}) == len(one)


def test_slots_for_hands_each_side_the_other():
    cands = [Candidate("a", "A", "10.0.0.1", 7001), Candidate("b", "B", "10.0.0.2", 7002)]
    test = schedule(cands, {}, frozenset(), T0, ScheduleOptions(daily_budget_bytes=1e18),
                    rng=random.Random(0))[0]
    send, receive = slots_for(test)
    send.check(), receive.check()
    assert (send.role, receive.role) == ("send", "receive")
    assert send.peer_id == test.receiver.node_id and send.peer_address == test.receiver.address
    assert receive.peer_id == test.sender.node_id and receive.peer_address == test.sender.address
    assert send.port == receive.port == test.receiver.port
    assert send.secret == receive.secret == test.secret and len(test.secret) == 32
    assert send.end_ms == receive.end_ms == test.end_ms


@pytest.mark.parametrize("field, value", [("slot_s", 6.0), ("slip_s", 7200.0), ("streams", 0),
                                          ("duration_s", 0.5), ("period_s", float("nan"))])
def test_bad_options_are_refused_naming_the_field(field, value):
    with pytest.raises(InputError, match=field):
        ScheduleOptions(**{"period_s": 3600, field: value})


def test_a_node_listed_twice_is_refused():
    cands = [Candidate("a", "A", "10.0.0.1", 1), Candidate("a", "B", "10.0.0.2", 1)]
    with pytest.raises(InputError, match="node a is listed twice"):
        schedule(cands, {}, frozenset(), T0, ScheduleOptions(), rng=random.Random(0))


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_a_candidate_without_a_throughput_port_is_refused(port):
    with pytest.raises(InputError, match="port"):
        Candidate("a", "A", "10.0.0.1", port)
