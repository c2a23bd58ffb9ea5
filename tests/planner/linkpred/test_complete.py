"""Completion with a link prediction (planner.linkpred.complete, planner.core.sites): which pairs
take the prediction's conservative figures, which keep today's rule, and the completed fleet
written back as site links."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.core.fleet import GBIT, Fleet, Link, Node, Site, SiteLink, bandwidth_from_rtt, complete
from planner.files.fleet import load_fleet, save_fleet_json
from planner.linkpred.complete import (MIN_MEASURED_THROUGHPUTS, completed_fleet, link_counts,
                                       measured_only, network_with_links, predict_fleet_links)
from planner.linkpred.graph import Source
from planner.linkpred.models import chosen_model
from tests.helpers.link_predictions import FixedLinkModel, link_prediction
from tests.helpers.paths import REPO

EXAMPLE = REPO / "examples" / "fleets" / "asia-24.json"


def _node(i: int, site: str) -> Node:
    return Node(f"n{i}", gpus=8, gpu_name="A100", memory_gb=640, site=site)


def _ring_fleet(sites: int = 12, throughputs: int = MIN_MEASURED_THROUGHPUTS) -> Fleet:
    """One server per site; a ring of measured site pairs (RTT), the first ``throughputs`` of
    them with a measured throughput too."""
    names = [f"s{k:02d}" for k in range(sites)]
    nodes = tuple(_node(k, name) for k, name in enumerate(names))
    links = tuple(Link(f"n{k}", f"n{(k + 1) % sites}", rtt_ms=10.0 + k,
                       bandwidth_gbps=2.0 + 0.1 * k if k < throughputs else None)
                  for k in range(sites))
    return Fleet(nodes, links, name="ring", sites=tuple(Site(n) for n in names))


def _same(a, b) -> None:
    np.testing.assert_array_equal(a.rtt_ms, b.rtt_ms)
    np.testing.assert_array_equal(a.bw, b.bw)
    np.testing.assert_array_equal(a.imputed, b.imputed)


def test_without_enough_measured_throughput_the_prediction_is_todays_rule():
    fleet = load_fleet(EXAMPLE)         # RTTs only: nothing to learn a throughput from
    prediction = predict_fleet_links(fleet)
    assert prediction.model == "formula"
    assert not (prediction.rtt_source == Source.PREDICTED).any()
    assert not (prediction.gbps_source == Source.PREDICTED).any()
    _same(complete(fleet, prediction=prediction), complete(fleet))
    _same(network_with_links(fleet, "predicted"), complete(fleet))


def test_one_throughput_short_of_the_minimum_is_still_the_formula():
    fleet = _ring_fleet(throughputs=MIN_MEASURED_THROUGHPUTS - 1)
    model = FixedLinkModel("fixed", gbps=3.0)
    assert predict_fleet_links(fleet, model).model == "formula"
    assert model.fits == 0
    assert predict_fleet_links(_ring_fleet(), model).model == "fixed"


def test_the_default_model_is_the_benchmarks_choice():
    assert predict_fleet_links(_ring_fleet()).model == chosen_model().name


def test_unmeasured_pairs_take_the_conservative_figures_and_measured_ones_stay():
    fleet = _ring_fleet()
    model = FixedLinkModel("fixed", gbps=3.0, rtt_ms=50.0)   # bounds: 75 ms, 1.5 Gbit/s
    net = complete(fleet, prediction=predict_fleet_links(fleet, model))
    today = complete(fleet)
    # n0-n1 measured both: as today. n8-n9: RTT measured, throughput not: the lower bound.
    assert net.rtt_ms[0, 1] == today.rtt_ms[0, 1] == 10.0
    assert net.bw[0, 1] == today.bw[0, 1] == 2.0 * GBIT
    assert net.rtt_ms[8, 9] == 18.0
    assert net.bw[8, 9] == pytest.approx(1.5 * GBIT)
    # n0-n5: nothing measured: upper RTT and lower throughput, still marked completed.
    assert net.rtt_ms[0, 5] == net.rtt_ms[5, 0] == pytest.approx(75.0)
    assert net.bw[0, 5] == pytest.approx(1.5 * GBIT)
    assert net.imputed[0, 5] and not net.imputed[0, 1]
    assert today.rtt_ms[0, 5] == 60.0          # relay over the ring


def test_formula_pairs_keep_todays_rule_and_same_site_pairs_are_untouched():
    nodes = (_node(0, "a"), _node(1, "a"), _node(2, "b"), _node(3, "c"))
    fleet = Fleet(nodes, (Link("n0", "n1", 0.5), Link("n1", "n2", 30.0, 4.0),
                          Link("n2", "n3", 20.0)))
    sites = ("a", "b", "c")
    prediction = link_prediction(sites, {("a", "c"): (70.0, 90.0, 5.0, 1.0, Source.FORMULA)})
    _same(complete(fleet, prediction=prediction), complete(fleet))
    predicted = link_prediction(sites, {("a", "c"): (70.0, 90.0, 5.0, 1.0, Source.PREDICTED),
                                        ("a", "b"): (1.0, 1.0, 99.0, 99.0, Source.PREDICTED)})
    net = complete(fleet, prediction=predicted)
    today = complete(fleet)
    for a in (0, 1):
        assert net.rtt_ms[a, 3] == 90.0 and net.bw[a, 3] == 1.0 * GBIT
    # a-b has a node link (RTT and throughput): no prediction reaches its servers' pairs.
    assert net.rtt_ms[0, 2] == today.rtt_ms[0, 2] and net.bw[0, 2] == today.bw[0, 2]
    assert net.rtt_ms[0, 1] == today.rtt_ms[0, 1]


def test_a_predicted_rtt_without_a_predicted_throughput_takes_the_window_formula_of_it():
    fleet = Fleet((_node(0, "a"), _node(1, "b"), _node(2, "c")),
                  (Link("n0", "n1", 10.0), Link("n1", "n2", 10.0)))
    prediction = link_prediction(("a", "b", "c"), {
        ("a", "c"): (30.0, 40.0, 5.0, 1.0, Source.PREDICTED, Source.FORMULA)})
    net = complete(fleet, prediction=prediction)
    assert net.rtt_ms[0, 2] == 40.0
    assert net.bw[0, 2] == pytest.approx(bandwidth_from_rtt(40.0))


def test_site_links_a_completion_wrote_are_used_with_their_conservative_figures():
    nodes = (_node(0, "a"), _node(1, "b"), _node(2, "c"))
    links = (SiteLink("a", "b", 10.0, 5.0),
             SiteLink("a", "c", 20.0, 4.0, source="predicted", rtt_hi_ms=25.0,
                      bandwidth_lo_gbps=2.0),
             SiteLink("b", "c", 30.0, 9.0, source="formula", rtt_hi_ms=30.0))
    net = complete(Fleet(nodes, (), sites=(Site("a"), Site("b"), Site("c")), site_links=links))
    assert (net.rtt_ms[0, 1], net.bw[0, 1]) == (10.0, 5.0 * GBIT)
    assert (net.rtt_ms[0, 2], net.bw[0, 2]) == (25.0, 2.0 * GBIT)
    assert net.rtt_ms[1, 2] == 30.0
    assert net.bw[1, 2] == pytest.approx(bandwidth_from_rtt(30.0))   # formula: not the 9 given
    # A prediction passed too does not override what the file gives.
    other = link_prediction(("a", "b", "c"), {}, other=(1.0, 1.0, 50.0, 50.0, Source.PREDICTED))
    _same(complete(Fleet(nodes, (), sites=(Site("a"), Site("b"), Site("c")), site_links=links),
                   prediction=other), net)


def test_the_completed_fleet_has_a_site_link_for_every_pair(tmp_path):
    fleet = _ring_fleet()
    prediction = predict_fleet_links(fleet, FixedLinkModel("fixed", gbps=3.0, rtt_ms=40.0))
    done = completed_fleet(fleet, prediction)
    pairs = {frozenset((k.src, k.dst)): k for k in done.site_links}
    assert len(pairs) == len(done.site_links) == 12 * 11 // 2
    both = pairs[frozenset(("s00", "s01"))]
    assert (both.source, both.rtt_ms, both.bandwidth_gbps) == ("measured", 10.0, 2.0)
    half = pairs[frozenset(("s08", "s09"))]   # RTT measured, throughput predicted
    assert (half.source, half.rtt_ms, half.rtt_hi_ms) == ("predicted", 18.0, 18.0)
    assert (half.bandwidth_gbps, half.bandwidth_lo_gbps) == (3.0, 1.5)
    far = pairs[frozenset(("s00", "s05"))]
    assert (far.source, far.rtt_ms, far.rtt_hi_ms) == ("predicted", 40.0, 60.0)
    assert link_counts(prediction)["gbps"] == {"measured": 8, "predicted": 58, "formula": 0}
    assert done.nodes == fleet.nodes and tuple(done.links) == tuple(fleet.links)

    # Read back, it plans as the original completed with the prediction (one server a site).
    path = tmp_path / "completed.json"
    save_fleet_json(done, path)
    again = load_fleet(path)
    assert again.site_links == done.site_links
    _same(complete(again), complete(fleet, prediction=prediction))
    _same(network_with_links(again, "predicted"), complete(again))
    # Its completed links are no measurements: the fit sees the original's measured set.
    assert [k.source for k in measured_only(again).site_links] == ["measured"] * 8
    refit = predict_fleet_links(again, FixedLinkModel("fixed", gbps=3.0, rtt_ms=40.0))
    np.testing.assert_array_equal(refit.gbps_source, prediction.gbps_source)


def test_the_formula_completion_reads_back_to_the_same_network(tmp_path):
    fleet = _ring_fleet(throughputs=0)
    done = completed_fleet(fleet, predict_fleet_links(fleet))
    assert {k.source for k in done.site_links} == {"formula"}   # no throughput measured
    path = tmp_path / "completed.json"
    save_fleet_json(done, path)
    _same(complete(load_fleet(path)), complete(fleet))


@pytest.mark.parametrize("site", ["", "only-site"])
def test_servers_without_named_sites_or_in_one_site_plan_as_before(site):
    """The store's servers without a city have no named site (the lab's hub plans from them)."""
    nodes = tuple(_node(k, site) for k in range(4))
    links = tuple(Link(f"n{a}", f"n{b}", rtt_ms=5.0 + a + b, bandwidth_gbps=1.0 + a)
                  for a in range(4) for b in range(a + 1, 4))
    fleet = Fleet(nodes, links, name="unnamed")
    prediction = predict_fleet_links(fleet)
    _same(complete(fleet, prediction=prediction), complete(fleet))
    _same(network_with_links(fleet, "predicted"), complete(fleet))


def test_links_choice_is_checked():
    with pytest.raises(ValueError, match="links"):
        network_with_links(_ring_fleet(), "guessed")


def test_a_measured_site_link_completion_writes_carries_its_real_samples(tmp_path):
    """A pair measured in both figures by node links is written a measured site link with the
    RTT samples behind it (both directions, every server pair of the two sites) and their mean
    loss, as `fleet export --site-links` rolls them up."""
    nodes = (_node(0, "a"), _node(1, "a"), _node(2, "b"), _node(3, "c"))
    links = (Link("n0", "n2", 10.0, 2.0, loss=0.1, samples=40),
             Link("n2", "n1", 12.0, 3.0, loss=0.0, samples=60),
             Link("n2", "n3", 20.0, samples=7))
    fleet = Fleet(nodes, links, sites=(Site("a"), Site("b"), Site("c")))
    done = completed_fleet(fleet, predict_fleet_links(fleet))
    pairs = {frozenset((k.src, k.dst)): k for k in done.site_links}
    both = pairs[frozenset(("a", "b"))]
    assert (both.source, both.samples) == ("measured", 100)
    assert both.loss == pytest.approx(0.05)
    path = tmp_path / "completed.json"
    save_fleet_json(done, path)
    written = {frozenset((k["src"], k["dst"])): k
               for k in json.loads(path.read_text())["site_links"]}
    assert (written[frozenset(("a", "b"))]["source"],
            written[frozenset(("a", "b"))]["samples"]) == ("measured", 100)
    # b-c measured its RTT only: completed, not measured, so no count is claimed for it.
    assert pairs[frozenset(("b", "c"))].source == "formula"


def test_a_measured_throughput_without_rtt_is_kept_measured_with_completions_rtt():
    nodes = (_node(0, "a"), _node(1, "b"), _node(2, "c"))
    links = (SiteLink("a", "b", rtt_ms=400.0, bandwidth_gbps=0.2, rtt_source="formula"),
             SiteLink("a", "c", rtt_ms=10.0, samples=5), SiteLink("c", "b", rtt_ms=15.0))
    fleet = Fleet(nodes, (), sites=(Site("a"), Site("b"), Site("c")), site_links=links)
    prediction = predict_fleet_links(fleet)
    assert link_counts(prediction)["gbps"]["measured"] == 1
    done = {frozenset((k.src, k.dst)): k for k in completed_fleet(fleet, prediction).site_links}
    ab = done[frozenset(("a", "b"))]
    # The RTT given was the formula's too: completion relays over the measured ones instead.
    assert (ab.source, ab.rtt_source, ab.rtt_ms, ab.bandwidth_gbps) == ("measured", "formula",
                                                                        25.0, 0.2)
    net = complete(completed_fleet(fleet, prediction))
    assert net.bw[0, 1] == pytest.approx(0.2 * GBIT) and net.rtt_ms[0, 1] == 25.0
    # A predicted RTT replaces the formula's in plans; the measured throughput stays.
    predicted = link_prediction(("a", "b", "c"), {
        ("a", "b"): (30.0, 40.0, 0.2, 0.2, Source.PREDICTED, Source.MEASURED)})
    net = complete(fleet, prediction=predicted)
    assert net.rtt_ms[0, 1] == 40.0 and net.bw[0, 1] == pytest.approx(0.2 * GBIT)
