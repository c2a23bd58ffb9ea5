"""The probe plan's guarantees, checked on generated fleets (hypothesis) and at 10,000 servers:
the peer bound, every ordered site pair each epoch, every server probed from every other site
within the stated rotation period, and full probing where it fits."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.core.probe_plan import plan_shape, probe_plan, site_key


@st.composite
def fleets(draw):
    """{node id: site} with 1-10 named sites of 1-14 nodes, sometimes nodes of no site."""
    sizes = draw(st.lists(st.integers(1, 14), min_size=1, max_size=10))
    nodes = {f"s{s}-n{i}": f"site-{s}" for s, size in enumerate(sizes) for i in range(size)}
    for i in range(draw(st.integers(0, 3))):
        nodes[f"lost-{i}"] = None
    return nodes


def members_by_site(nodes):
    out = defaultdict(set)
    for node, site in nodes.items():
        out[site].add(node)
    return out


@settings(max_examples=150)
@given(fleets(), st.integers(2, 24), st.integers(1, 3), st.integers(0, 10_000))
def test_every_node_keeps_the_bound_and_probes_only_others(nodes, bound, reps, epoch):
    plan = probe_plan(nodes, epoch, bound, reps)
    assert set(plan) == set(nodes)
    for node, peers in plan.items():
        assert len(peers) <= bound
        assert node not in peers and len(set(peers)) == len(peers)
        assert set(peers) <= set(nodes)


@settings(max_examples=150)
@given(fleets(), st.integers(2, 24), st.integers(1, 3), st.integers(0, 10_000))
def test_every_ordered_site_pair_is_probed_each_epoch_when_the_sites_have_room(
        nodes, bound, reps, epoch):
    shape = plan_shape(nodes, bound, reps)
    assume(shape.covers_all_site_pairs)
    plan = probe_plan(nodes, epoch, shape=shape)
    probed = {(nodes[a], nodes[b]) for a, peers in plan.items() for b in peers}
    sites = set(nodes.values())
    for s in sites:
        for t in sites - {s}:
            assert (s, t) in probed and (t, s) in probed  # representatives at both ends


@settings(max_examples=80, deadline=None)
@given(fleets(), st.integers(2, 24), st.integers(1, 3), st.integers(0, 10_000))
def test_within_the_rotation_period_every_server_is_probed_from_every_other_site(
        nodes, bound, reps, start):
    shape = plan_shape(nodes, bound, reps)
    period = shape.rotation_period
    assert period is not None  # a bound of 2 leaves every site room to probe out
    assume(period <= 120)
    by_site = members_by_site(nodes)
    heard_from: dict[str, set] = defaultdict(set)   # node -> sites that probed it
    pairs: set[tuple[str, str]] = set()
    for epoch in range(start, start + period):
        for a, peers in probe_plan(nodes, epoch, shape=shape).items():
            for b in peers:
                heard_from[b].add(nodes[a])
                pairs.add((a, b))
    for site, members in by_site.items():
        for node in members:
            assert heard_from[node] >= set(by_site) - {site}, node
            # ...and every ordered pair inside the site.
            assert {(node, other) for other in members - {node}} <= pairs


@given(fleets(), st.integers(2, 24), st.integers(1, 3))
def test_a_fleet_that_fits_the_bound_is_probed_in_full(nodes, bound, reps):
    assume(len(nodes) - 1 <= bound)
    plan = probe_plan(nodes, 5, bound, reps)
    assert all(set(peers) == set(nodes) - {node} for node, peers in plan.items())
    assert plan_shape(nodes, bound, reps).rotation_period == 1


@given(fleets(), st.integers(0, 100))
def test_the_plan_depends_on_the_nodes_not_their_order(nodes, epoch):
    shuffled = list(nodes.items())
    random.Random(epoch).shuffle(shuffled)
    assert probe_plan(dict(shuffled), epoch, 6, 2) == probe_plan(nodes, epoch, 6, 2)


def test_peers_rotate_from_epoch_to_epoch():
    nodes = {f"{s}-{i}": s for s in "abcdef" for i in range(10)}
    first, second = probe_plan(nodes, 0, 12, 1), probe_plan(nodes, 1, 12, 1)
    assert sum(first[n] != second[n] for n in nodes) > len(nodes) // 2
    assert probe_plan(nodes, 0, 12, 1) == first  # deterministic


def test_ten_thousand_servers_in_two_hundred_sites():
    nodes = {f"n{i:05d}": f"site-{i % 200:03d}" for i in range(10_000)}
    shape = plan_shape(nodes, 64, 2)
    assert shape.covers_all_site_pairs
    assert shape.rotation_period == 25            # 50 servers a site, 2 representatives an epoch
    plan = probe_plan(nodes, 7, shape=shape)
    assert max(len(p) for p in plan.values()) <= 64
    received = defaultdict(int)
    for peers in plan.values():
        for b in peers:
            received[b] += 1
    # 49 from its own site and its share of 199 * 2 probes from other sites: spread evenly.
    assert max(received.values()) - min(received.values()) <= 1


def test_a_huge_site_is_sampled_and_a_tiny_one_probes_out_in_turns():
    nodes = {f"big-{i}": "big" for i in range(300)} | {"solo": "solo"} | \
        {f"s{k}-0": f"s{k}" for k in range(100)}
    shape = plan_shape(nodes, 16, 1)
    assert not shape.covers_all_site_pairs        # "solo" cannot probe 101 sites at once
    plan = probe_plan(nodes, 3, shape=shape)
    assert len(plan["solo"]) == 16 and len(plan["big-0"]) <= 16
    period = shape.rotation_period
    assert period is not None and period >= shape.pair_period(shape.sites.index("big"),
                                                              shape.sites.index("big"))


def test_bad_arguments():
    with pytest.raises(ValueError):
        plan_shape({"a": None}, 0)
    with pytest.raises(ValueError):
        probe_plan({"a": None}, -1)


@pytest.mark.parametrize("city, site, expected", [
    ("Paris", None, "Paris"), (" paris ", None, "Paris"), ("Atlantis", "", "Atlantis"),
    ("Paris", " aws:eu-west-3 ", "aws:eu-west-3"), (None, None, None), ("  ", None, None)])
def test_site_key(city, site, expected):
    assert site_key(city, site) == expected
