"""Completion with sites (docs/COSTMODEL.md section 2) on hand-made fleets, the columnar link
table against Link objects, the site roll-up and the regional generator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.core import sites as sites_module
from planner.core.fleet import (GBIT, Fleet, Link, LinkTable, Node, Site, SiteLink,
                                bandwidth_from_rtt, complete)
from planner.core.generate import generate_fleet, generate_regional_fleet
from planner.core.sites import roll_up_by_site


def node(i: str, site: str | None, city: str = "Paris") -> Node:
    return Node(i, city=city, site=site, compute_capability=8.0, memory_gb=320)


def rtt(net, a, b):
    return float(net.rtt_ms[net.index[a], net.index[b]])


def three_sites(site_links, links=()) -> Fleet:
    nodes = (node("a1", "A"), node("a2", "A"), node("b1", "B"), node("c1", "C"),
             node("d1", "D"))
    return Fleet(nodes, tuple(links), sites=tuple(Site(s) for s in "ABCD"),
                 site_links=tuple(site_links))


def test_pairs_between_linked_sites_take_the_site_link():
    f = three_sites([SiteLink("A", "B", 50.0), SiteLink("B", "C", 20.0)])
    net = complete(f)
    assert rtt(net, "a1", "b1") == rtt(net, "b1", "a2") == 50.0
    i, j = net.index["a1"], net.index["b1"]
    assert net.imputed[i, j] and net.bw[i, j] == pytest.approx(bandwidth_from_rtt(50.0))
    # A and C have no site link: the shortest path over site links (A-B-C), before anything else.
    assert rtt(net, "a1", "c1") == 70.0
    # D has no site link and no node link: it cannot be reached.
    assert math.isinf(rtt(net, "a1", "d1")) and net.bw[net.index["a1"], net.index["d1"]] == 0.0


def test_node_links_override_site_links_and_reach_unlinked_sites():
    f = three_sites([SiteLink("A", "B", 50.0, bandwidth_gbps=2.0)],
                    [Link("a1", "b1", 40.0), Link("d1", "b1", 100.0, bandwidth_gbps=0.5)])
    net = complete(f)
    assert rtt(net, "a1", "b1") == 40.0 and not net.imputed[net.index["a1"], net.index["b1"]]
    assert rtt(net, "a2", "b1") == 50.0
    # Measured site bandwidth for site pairs, the TCP model for a measured pair without one.
    assert net.bw[net.index["a2"], net.index["b1"]] == pytest.approx(2.0 * GBIT)
    assert net.bw[net.index["a1"], net.index["b1"]] == pytest.approx(bandwidth_from_rtt(40.0))
    assert net.bw[net.index["d1"], net.index["b1"]] == pytest.approx(0.5 * GBIT)
    # D is reached only through the node link d1-b1, then relayed over node links and site
    # figures: d1-b1 (100) + b1-a1 (40, measured) + a1-a2 (1 ms, same site) beats b1-a2 (50).
    assert rtt(net, "d1", "a2") == rtt(net, "a2", "d1") == 141.0
    assert rtt(net, "d1", "c1") == math.inf


def test_same_site_pairs_take_the_site_self_link_else_the_median():
    f = three_sites([SiteLink("A", "A", 0.4), SiteLink("A", "B", 50.0)])
    assert rtt(complete(f), "a1", "a2") == 0.4
    g = three_sites([SiteLink("A", "B", 50.0)])
    assert rtt(complete(g), "a1", "a2") == 1.0     # no same-site measurement anywhere: 1 ms
    h = Fleet(g.nodes + (node("b2", "B"),), (Link("b1", "b2", 3.0),), sites=g.sites,
              site_links=g.site_links)
    assert rtt(complete(h), "a1", "a2") == 3.0     # the fleet's same-site median


def test_site_defaults_to_city_and_without_site_links_nothing_changes():
    nodes = (node("p1", None, "Paris"), node("p2", None, "paris"), node("t1", None, "Tokyo"))
    links = (Link("p1", "t1", 200.0), Link("p2", "t1", 210.0))
    plain = complete(Fleet(nodes, links))
    assert nodes[1].site_key == "Paris" and rtt(plain, "p1", "p2") == 1.0
    sited = complete(Fleet(nodes, links, site_links=(SiteLink("Paris", "Tokyo", 180.0),)))
    assert rtt(sited, "p1", "t1") == 200.0 and rtt(sited, "p1", "p2") == 1.0


def test_link_table_completes_like_link_objects():
    fleet = generate_fleet(40, seed=5, missing_fraction=0.3)
    ids = [n.id for n in fleet.nodes]
    index = {i: k for k, i in enumerate(ids)}
    table = LinkTable(ids, [index[k.src] for k in fleet.links], [index[k.dst] for k in fleet.links],
                      [k.rtt_ms for k in fleet.links], [np.nan] * len(fleet.links),
                      [k.loss for k in fleet.links], [k.samples for k in fleet.links])
    assert table == fleet.links and tuple(table)[3] == fleet.links[3] == table[3]
    a, b = complete(fleet), complete(Fleet(fleet.nodes, table))
    for name in ("rtt_ms", "bw", "imputed"):
        assert np.array_equal(getattr(a, name), getattr(b, name))


def test_large_fleets_use_float32(monkeypatch):
    monkeypatch.setattr(sites_module, "FLOAT32_FROM_NODES", 10)
    fleet = generate_regional_fleet(30, 4, seed=2)
    net = complete(fleet)
    assert net.rtt_ms.dtype == np.float32 and net.bw.dtype == np.float32
    monkeypatch.setattr(sites_module, "FLOAT32_FROM_NODES", 10_000)
    exact = complete(fleet)
    assert np.allclose(net.rtt_ms, exact.rtt_ms, rtol=1e-6)


def test_regional_generator_is_site_links_only_and_complete():
    fleet = generate_regional_fleet(300, 12, seed=4)
    assert fleet == generate_regional_fleet(300, 12, seed=4)
    assert len(fleet.nodes) == 300 and len(fleet.sites) == 12 and not fleet.links
    assert len(fleet.site_links) == 12 * 13 // 2
    assert {n.site for n in fleet.nodes} == {s.id for s in fleet.sites}
    net = complete(fleet)
    assert np.isfinite(net.rtt_ms).all() and net.imputed.sum() == 300 * 299
    by_site = {(k.src, k.dst): k.rtt_ms for k in fleet.site_links}
    a, b = fleet.nodes[0], fleet.nodes[-1]
    key = (a.site, b.site) if (a.site, b.site) in by_site else (b.site, a.site)
    assert rtt(net, a.id, b.id) == by_site[key]


def test_roll_up_gives_site_medians():
    fleet = generate_fleet(60, seed=3, n_cities=4, missing_fraction=0.0)
    rolled = roll_up_by_site(fleet)
    assert not rolled.links and len(rolled.site_links) == 4 * 5 // 2
    full, by_site = complete(fleet), complete(rolled)
    cities = {n.city_key for n in fleet.nodes}
    assert {s.id for s in rolled.sites} == cities
    first = {c: next(n.id for n in fleet.nodes if n.city_key == c) for c in cities}
    for link in rolled.site_links:
        members_a = [full.index[n.id] for n in fleet.nodes if n.city_key == link.src]
        members_b = [full.index[n.id] for n in fleet.nodes if n.city_key == link.dst]
        block = full.rtt_ms[np.ix_(members_a, members_b)]
        values = block[~np.eye(*block.shape, dtype=bool)] if link.src == link.dst else block
        assert link.rtt_ms == pytest.approx(float(np.median(values)))
        if link.src != link.dst:
            assert rtt(by_site, first[link.src], first[link.dst]) == pytest.approx(link.rtt_ms)
