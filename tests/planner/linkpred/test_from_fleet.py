"""site_graph: a fleet's named sites, providers, places, GPUs and measured site pairs."""

import math

import numpy as np

from planner.core.fleet import Fleet, Link, Node, Site, SiteLink
from planner.linkpred.from_fleet import site_graph
from planner.linkpred.graph import Source
from planner.linkpred.models import MODELS, chosen_model


def _fleet() -> Fleet:
    nodes = (Node("a1", site="aws:us-east-1", gpus=8, latitude=39.0, longitude=-77.0),
             Node("a2", site="aws:us-east-1", gpus=4, latitude=41.0, longitude=-77.0),
             Node("g1", site="gcp:europe-west4", gpus=2),
             Node("x1", site="lab", gpus=1),
             Node("nowhere", gpus=3))          # no site, no city: not a site of the graph
    links = (Link("a1", "g1", 80.0, 5.0), Link("g1", "a2", 90.0, 7.0),   # rolled up: medians
             Link("a2", "g1", 100.0, None),
             Link("a1", "a2", 0.3, 50.0),                                 # same site: no edge
             Link("x1", "nowhere", 10.0, 1.0))                            # no site: no edge
    sites = (Site("lab", 52.37, 4.90),)
    site_links = (SiteLink("lab", "aws:us-east-1", 85.0, None),
                  SiteLink("aws:us-east-1", "lab", 95.0, 2.0))
    return Fleet(nodes, links, sites=sites, site_links=site_links)


def test_site_graph_reads_sites_places_gpus_and_rolled_up_pairs():
    graph = site_graph(_fleet())
    assert graph.sites == ("lab", "aws:us-east-1", "gcp:europe-west4")
    assert graph.provider == ("", "aws", "gcp")
    assert graph.gpus.tolist() == [1, 12, 2]
    assert (graph.latitude[0], graph.longitude[0]) == (52.37, 4.90)        # the Site's place
    assert (graph.latitude[1], graph.longitude[1]) == (40.0, -77.0)        # mean of its nodes
    assert math.isfinite(graph.latitude[2])                                # the region's place
    pairs = {(graph.sites[a], graph.sites[b]): (r, g)
             for a, b, r, g in zip(graph.i, graph.j, graph.rtt_ms, graph.gbps)}
    assert set(pairs) == {("lab", "aws:us-east-1"), ("aws:us-east-1", "gcp:europe-west4")}
    assert pairs[("aws:us-east-1", "gcp:europe-west4")] == (90.0, 6.0)
    assert pairs[("lab", "aws:us-east-1")] == (90.0, 2.0)
    assert np.all(graph.i < graph.j)


def test_chosen_model_completes_every_pair_keeping_measured_ones():
    graph = site_graph(_fleet())
    prediction = chosen_model().fit(graph, seed=0).predict(graph)
    assert prediction.model in MODELS
    off = ~np.eye(graph.n_sites, dtype=bool)
    assert np.all(prediction.gbps[off] > 0) and np.all(prediction.rtt_ms[off] > 0)
    assert prediction.gbps[1, 2] == 6.0 and prediction.gbps_source[1, 2] == Source.MEASURED
    assert prediction.gbps_source[0, 2] != Source.MEASURED
    assert prediction.gbps_lo[0, 2] <= prediction.gbps[0, 2]
    assert prediction.rtt_hi_ms[0, 2] >= prediction.rtt_ms[0, 2]
