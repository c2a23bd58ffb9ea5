"""docs/COSTMODEL.md section 2 completion rule (planner.core.fleet.complete) on hand-made fleets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.core.fleet import Fleet, Link, Node, complete
from planner.service.graph import fleet_graph


def fleet(cities: dict[str, str], links: list[tuple[str, str, float]]) -> Fleet:
    return Fleet(tuple(Node(i, city=c, compute_capability=8.0, memory_gb=320)
                       for i, c in cities.items()),
                 tuple(Link(a, b, rtt_ms=r) for a, b, r in links))


def rtt(net, a, b):
    return net.rtt_ms[net.index[a], net.index[b]]


def test_same_city_median_of_that_city():
    f = fleet({"a": "Paris", "b": "Paris", "c": "Paris", "d": "Paris", "x": "Tokyo"},
              [("a", "b", 1.0), ("a", "c", 2.0), ("b", "c", 6.0), ("a", "x", 200.0)])
    net = complete(f)
    # Measured Paris pairs: 1, 2, 6 -> median 2. Pairs with d were never measured.
    assert rtt(net, "a", "d") == 2.0 and rtt(net, "c", "d") == 2.0
    assert net.imputed[net.index["a"], net.index["d"]]
    assert not net.imputed[net.index["a"], net.index["b"]]


def test_same_city_falls_back_to_fleet_median_then_1ms():
    f = fleet({"a": "Paris", "b": "Paris", "c": "Rome", "d": "Rome", "e": "Rome"},
              [("a", "b", 3.0), ("c", "a", 20.0), ("d", "a", 21.0), ("e", "a", 22.0)])
    net = complete(f)
    assert rtt(net, "c", "d") == 3.0  # Rome has no measured pair: the fleet's same-city median
    g = fleet({"a": "Paris", "b": "Paris", "c": "Rome"}, [("a", "c", 20.0), ("b", "c", 22.0)])
    assert rtt(complete(g), "a", "b") == 1.0  # no same-city measurement anywhere: 1 ms


def test_shortest_path_relay_and_split_components():
    f = fleet({"a": "Paris", "b": "Berlin", "c": "Tokyo", "d": "Sydney", "e": "Lima"},
              [("a", "b", 10.0), ("b", "c", 100.0), ("a", "c", 150.0), ("d", "e", 80.0)])
    net = complete(f)
    assert rtt(net, "a", "c") == 110.0 or rtt(net, "a", "c") == 150.0
    assert rtt(net, "a", "c") == 150.0  # measured pairs keep their measurement
    g = fleet({"a": "Paris", "b": "Berlin", "c": "Tokyo"}, [("a", "b", 10.0), ("b", "c", 100.0)])
    assert rtt(complete(g), "a", "c") == 110.0  # relayed through b
    assert math.isinf(rtt(net, "a", "d"))  # different components cannot communicate
    assert len(net.components()) == 2
    graph = fleet_graph(f)
    assert not graph.has_edge("a", "d") and graph.has_edge("d", "e")


def test_duplicates_averaged_self_loop_dropped():
    f = fleet({"a": "Paris", "b": "Tokyo"},
              [("a", "b", 200.0), ("b", "a", 260.0), ("a", "a", 5.0)])
    net = complete(f)
    assert rtt(net, "a", "b") == rtt(net, "b", "a") == 230.0
    assert rtt(net, "a", "a") == 0.0
    assert np.isinf(net.bw[0, 0])


def test_graph_marks_imputed_edges():
    f = fleet({"a": "Paris", "b": "Paris", "c": "Tokyo"}, [("a", "c", 200.0), ("b", "c", 210.0)])
    g = fleet_graph(f)
    assert g.edges["a", "b"]["imputed"] is True and g.edges["a", "b"]["rtt_ms"] == 1.0
    assert g.edges["a", "c"]["imputed"] is False and g.edges["a", "c"]["rtt_ms"] == 200.0
    assert g.nodes["a"]["throughput"] == pytest.approx(8 * 312e12 * 0.4)
