"""Site-pair rollups made at rollup time (store schema 3, a real SQLite store): in a large fleet
measurements between two sites are kept per site pair per day, with the same figures as the
merge of the node-pair rollups they replace; the fleet read from them has the same site links
as folding node pairs at read time; a schema-2 file migrates in place; the report interval
pushed to agents grows with the fleet."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hulk.wire.records import NodeLocation, ProbeSettings, RegisterRequest
from planner.core.site_pairs import fold_site_pairs
from planner.service.graph import fleet_from_store
from planner.service.ingest import IngestService, auto_report_interval_s
from planner.service.store import DAY_MS, Store
from tests.helpers.site_rollups import (SITE_OF, T0, assert_same_rollup,
                                        downgrade_to_schema_2, fill, make_store)

rtts = st.lists(st.one_of(st.none(), st.floats(0.05, 400.0)), min_size=1, max_size=6)
measurements = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 2), st.booleans(), rtts)
    .filter(lambda m: m[0] != m[1]), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None)
@given(measurements)
def test_site_pair_rollups_equal_the_merge_of_the_node_pair_rollups_they_replace(batch):
    folded, folded_refs = make_store(":memory:", per_pair_up_to=0)
    per_pair, per_pair_refs = make_store(":memory:", per_pair_up_to=1000)
    fill(folded, folded_refs, batch)
    fill(per_pair, per_pair_refs, batch)
    for window in (1, 3):   # the last day alone, and all three days
        want = fold_site_pairs(((p.src, p.dst, p.rollup)
                                for p in per_pair.window_rollups(window)), SITE_OF)
        got = {(p.src, p.dst): p.rollup for p in folded.site_window_rollups(window)}
        assert sorted(got) == sorted(want.site_pairs)
        for key, rollup in want.site_pairs.items():
            assert_same_rollup(got[key], rollup)
        kept = [(p.src, p.dst, p.rollup) for p in folded.window_rollups(window)]
        assert [(s, d) for s, d, _ in kept] == sorted((s, d) for s, d, _ in want.node_pairs)
        for (_, _, g), (_, _, w) in zip(kept, sorted(want.node_pairs, key=lambda p: p[:2])):
            assert_same_rollup(g, w)
    # Nothing between two sites is left as a node pair in the folded store.
    assert all(SITE_OF[p.src] is None or SITE_OF[p.dst] is None
               or SITE_OF[p.src] == SITE_OF[p.dst] for p in folded.window_rollups(3))
    assert per_pair.site_window_rollups(3) == []
    folded.close()
    per_pair.close()


FIXED = [(0, 2, 0, False, [11.0, 13.0]), (1, 3, 1, True, [15.0, None, 16.0]),
         (2, 1, 2, True, [14.0]), (0, 1, 2, False, [0.4, 0.6]), (5, 0, 1, False, [50.0]),
         (4, 0, 0, True, [120.0, 130.0]), (0, 4, 2, False, [None, None])]


def test_a_fleet_read_from_site_pair_rollups_has_the_site_links_of_read_time_folding():
    folded, folded_refs = make_store(":memory:", per_pair_up_to=0)
    per_pair, per_pair_refs = make_store(":memory:", per_pair_up_to=1000)
    fill(folded, folded_refs, FIXED)
    fill(per_pair, per_pair_refs, FIXED)
    got = fleet_from_store(folded, site_links=True)
    want = fleet_from_store(per_pair, site_links=True)   # folds node pairs as it reads them
    assert [(k.src, k.dst, k.samples, k.loss) for k in got.site_links] == \
        [(k.src, k.dst, k.samples, k.loss) for k in want.site_links]
    assert [k.rtt_ms for k in got.site_links] == pytest.approx([k.rtt_ms for k in want.site_links])
    assert [(k.src, k.dst) for k in got.site_links] == [("Paris", "Rome"), ("Rome", "Paris"),
                                                        ("Tokyo", "Paris")]
    assert got.links == want.links and got.sites == want.sites
    assert sorted((k.src, k.dst) for k in got.links) == [("nowhere", "par-1"), ("par-1", "par-2")]
    # Every probe par-1 -> tok-1 was lost: the site pair has samples but no RTT, so no link;
    # tok-1 -> par-1 came as a summary.
    tokyo = next(k for k in got.site_links if k.src == "Tokyo")
    assert tokyo.rtt_ms == pytest.approx(125.0) and tokyo.samples == 2
    assert ("Paris", "Tokyo", 2, 2, 0.0) in folded.site_window_totals(3)
    folded.close()
    per_pair.close()


def test_a_schema_2_store_migrates_in_place_and_folds_pairs_between_sites(tmp_path):
    path = tmp_path / "planner.db"
    store, refs = make_store(path, per_pair_up_to=1000)
    fill(store, refs, FIXED)
    before = fleet_from_store(store, site_links=True)
    rollups = store.window_rollups(3)
    store.close()
    downgrade_to_schema_2(path)

    with Store(path, clock=lambda: T0 + 2 * DAY_MS, per_pair_up_to=3) as migrated:  # 6 > 3
        assert migrated.database.meta("schema_version") == "3"
        assert {r["id"]: r["site"] for r in migrated.nodes()} == SITE_OF
        kept = {(p.src, p.dst) for p in migrated.window_rollups(3)}
        assert kept == {("nowhere", "par-1"), ("par-1", "par-2")}
        want = fold_site_pairs(((p.src, p.dst, p.rollup) for p in rollups), SITE_OF)
        got = {(p.src, p.dst): p.rollup for p in migrated.site_window_rollups(3)}
        assert sorted(got) == sorted(want.site_pairs)
        for key, rollup in want.site_pairs.items():
            assert_same_rollup(got[key], rollup)
        after = fleet_from_store(migrated, site_links=True)
        assert after.links == before.links
        assert [(k.src, k.dst, k.samples) for k in after.site_links] == \
            [(k.src, k.dst, k.samples) for k in before.site_links]
        # New measurements between sites go straight to site pairs.
        fill(migrated, migrated.node_refs(), [(0, 2, 2, True, [12.0])])
        assert {(p.src, p.dst) for p in migrated.window_rollups(3)} == kept


def test_a_small_schema_2_store_keeps_its_node_pairs_and_folds_them_once_it_grows(tmp_path):
    path = tmp_path / "planner.db"
    store, refs = make_store(path, per_pair_up_to=1000)
    fill(store, refs, FIXED)
    pairs = [(p.src, p.dst) for p in store.window_rollups(3)]
    store.close()
    downgrade_to_schema_2(path)
    with Store(path, clock=lambda: T0 + 2 * DAY_MS) as migrated:
        assert [(p.src, p.dst) for p in migrated.window_rollups(3)] == pairs
        assert migrated.site_window_rollups(3) == []
        assert migrated.nodes()[0]["site"] == "Paris"
    with Store(path, clock=lambda: T0 + 2 * DAY_MS, per_pair_up_to=5) as grown:
        assert grown.prune()["folded_into_site_pairs"] == 5   # the five pairs between sites
        assert len(grown.site_window_rollups(3)) == 4


def test_the_automatic_report_interval_grows_with_the_fleet():
    assert [auto_report_interval_s(n) for n in (0, 1, 100)] == [0.0, 0.0, 0.0]   # agents' 5 s
    assert auto_report_interval_s(101) == pytest.approx(5.05)
    assert auto_report_interval_s(1000) == 50.0
    assert auto_report_interval_s(10_000) == 500.0          # 20 Reports a second
    assert auto_report_interval_s(12_000) == auto_report_interval_s(50_000) == 600.0


def test_registrations_answer_the_automatic_interval_unless_one_was_set():
    store = Store(":memory:", clock=lambda: T0)
    auto = IngestService(store, clock=lambda: T0)
    answers = [auto.register(RegisterRequest(f"n{i}", address=f"10.0.{i // 200}.{i % 200}",
                                             location=NodeLocation("Paris")))
               for i in range(140)]
    assert answers[0].settings.report_interval_s == 0.0       # one agent: its own 5 s
    assert answers[99].settings.report_interval_s == 0.0
    assert answers[139].settings.report_interval_s == pytest.approx(7.0)   # 140 / 20
    fixed = IngestService(store, clock=lambda: T0, settings=ProbeSettings(report_interval_s=600))
    assert fixed.register(RegisterRequest("n0", address="10.0.0.0", location=NodeLocation(
        "Paris"))).settings.report_interval_s == 600.0
    store.close()


def test_window_totals_summed_over_day_ranges_on_two_connections_equal_one_query(tmp_path):
    """The window's sums are read as two day ranges side by side (a file store); they add up to
    what one GROUP BY over the whole window gives, pairs found in one range only included."""
    store, refs = make_store(tmp_path / "p.db", per_pair_up_to=100)
    idx = {node: ref.idx for node, ref in refs.items()}
    today = (T0 + 2 * DAY_MS) // DAY_MS
    rows = []
    for n, day in enumerate(range(today - 80, today + 1, 7)):   # both halves of a 90-day window
        for k, (a, b) in enumerate([("par-1", "rom-1"), ("rom-1", "tok-1"), ("par-2", "par-1")]):
            if (n + k) % 3:   # some pairs miss some days
                rows.append((day, idx[a], idx[b], 10 + n, n % 3, 5.5 * (n + 1), 1.0, 100, 900, None))
    rows.append((today - 85, idx["tok-1"], idx["nowhere"], 4, 1, 12.0, 1.0, 100, 900, None))
    rows.append((today - 95, idx["par-1"], idx["tok-1"], 4, 0, 12.0, 1.0, 100, 900, None))  # too old
    store.conn.executemany("INSERT INTO rollups VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    got = sorted(store.window_totals(90))
    name = {v: k for k, v in idx.items()}
    want = sorted((name[a], name[b], c, lost, total) for a, b, c, lost, total in store.conn.execute(
        "SELECT src, dst, sum(count), sum(lost), total(sum) FROM rollups WHERE day >= ? "
        "GROUP BY src, dst", (today - 89,)))
    assert [g[:4] for g in got] == [w[:4] for w in want] and len(got) == 4
    assert [g[4] for g in got] == pytest.approx([w[4] for w in want], rel=1e-12)
    store.close()


def test_a_node_registers_again_when_the_automatic_interval_drifts_with_the_fleet():
    """An agent registered with a small fleet's interval is told at a heartbeat to Register again
    once the fleet has grown enough to double it, and not again after it has."""
    from hulk.wire.records import HeartbeatRequest

    store = Store(":memory:", clock=lambda: T0)
    ingest = IngestService(store, clock=lambda: T0)

    def register(i: int):
        return ingest.register(RegisterRequest(f"n{i}", address=f"10.0.{i // 200}.{i % 200}",
                                               location=NodeLocation("Paris")))

    assert register(0).settings.report_interval_s == 0.0      # its own 5 s
    for i in range(1, 190):
        register(i)                                            # 190 / 20 = 9.5 s: under 2x
    assert not ingest.interval_drifted("n0")
    for i in range(190, 200):
        register(i)                                            # 200 / 20 = 10 s: 2x of 5 s
    assert ingest.interval_drifted("n0") and not ingest.interval_drifted("n199")
    beat = ingest.heartbeat(HeartbeatRequest("n0", time_ms=T0))
    assert beat.peers_changed and not beat.reregister          # the agent's cue to Register
    assert register(0).settings.report_interval_s == 10.0
    assert not ingest.interval_drifted("n0")
    assert not ingest.interval_drifted("never-registered")
    store.close()
