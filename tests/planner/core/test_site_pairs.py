"""Site-pair statistics: measurements between two sites' servers fold into one rollup per ordered
site pair with exact sums (pure), and a store read as a large fleet gives site links for them
while pairs inside a site stay node links (a real SQLite store)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hulk.wire.records import NodeLocation, RegisterRequest
from planner.core.fleet import Link, Site, SiteLink
from planner.core.rollup import DailyRollup, bucket_index
from planner.core.site_pairs import fold_site_pairs, site_locations
from planner.service.graph import fleet_from_store
from planner.service.store import DAY_MS, Store


def test_fold_merges_pairs_between_sites_and_keeps_the_rest():
    r = DailyRollup.from_values
    pairs = [("a1", "b1", r([10.0, 12.0])), ("a2", "b2", r([20.0, None])),
             ("b1", "a1", r([11.0])), ("a1", "a2", r([0.5])), ("a1", "x", r([30.0])),
             ("a1", "ghost", r([40.0]))]
    out = fold_site_pairs(pairs, {"a1": "A", "a2": "A", "b1": "B", "b2": "B", "x": None})
    assert sorted(out.site_pairs) == [("A", "B"), ("B", "A")]
    ab = out.site_pairs[("A", "B")]
    assert (ab.count, ab.lost, ab.min, ab.max) == (4, 1, 10.0, 20.0)
    assert ab.stats().mean_ms == pytest.approx(14.0)                 # (10 + 12 + 20) / 3
    assert ab.buckets == r([10.0, 12.0, 20.0]).buckets
    assert out.folded == {("A", "B"): 2, ("B", "A"): 1}
    assert [(s, d) for s, d, _ in out.node_pairs] == [("a1", "a2"), ("a1", "x"), ("a1", "ghost")]
    # The inputs are not changed by merging.
    assert pairs[0][2].count == 2


def test_site_locations_are_the_mean_of_located_members():
    got = site_locations([("A", (10.0, 20.0)), ("A", (12.0, 22.0)), ("A", None), ("B", None),
                          (None, (1.0, 1.0))])
    assert got == {"A": (11.0, 21.0), "B": None}


T0 = 1_700_000_000_000 - 1_700_000_000_000 % DAY_MS + 3_600_000


def test_a_large_fleet_from_the_store_has_site_links(tmp_path: Path):
    store = Store(tmp_path / "s.db", clock=lambda: T0)
    refs = {}
    for node_id, city in [("par-1", "Paris"), ("par-2", "Paris"), ("rom-1", "Rome"),
                          ("rom-2", "Rome"), ("nowhere", "")]:
        refs[node_id], _ = store.register(RegisterRequest(node_id, location=NodeLocation(city)))

    def batch(src, dst, values, batch_id):
        rows = [(refs[src].idx, refs[dst].idx, T0 + k, 1, 56, int(v is None), v,
                 None if v is None else bucket_index(v)) for k, v in enumerate(values)]
        store.store_batch(refs[src], batch_id, rows)

    batch("par-1", "rom-1", [11.0, 13.0], "1")
    batch("par-2", "rom-2", [15.0, None], "2")
    batch("rom-1", "par-2", [14.0], "3")
    batch("par-1", "par-2", [0.4, 0.6], "4")
    batch("nowhere", "par-1", [50.0], "5")

    fleet = fleet_from_store(store, site_links=True)
    assert fleet.site_links == (SiteLink("Paris", "Rome", rtt_ms=pytest.approx(13.0),
                                         loss=pytest.approx(0.25), samples=4),
                                SiteLink("Rome", "Paris", rtt_ms=14.0, loss=0.0, samples=1))
    assert sorted((k.src, k.dst) for k in fleet.links) == [("nowhere", "par-1"),
                                                           ("par-1", "par-2")]
    assert [s.id for s in fleet.sites] == ["Paris", "Rome"]
    paris = fleet.sites[0]
    assert isinstance(paris, Site) and paris.latitude == pytest.approx(48.86, abs=0.1)
    assert {n.id: n.site_key for n in fleet.nodes}["nowhere"] is None

    # A small fleet reads as before: every measured pair a node link, no sites.
    small = fleet_from_store(store)
    assert small.site_links == () and small.sites == ()
    assert Link("par-1", "rom-1", rtt_ms=12.0, loss=0.0, samples=2) in small.links
    store.close()
