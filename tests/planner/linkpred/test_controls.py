"""The six link-prediction controls: what every model promises (measured pairs kept, bounds on
the conservative side, symmetric, deterministic, degrades to the formula), and that each
control does what it is named for on data built for it."""

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from planner.core.fleet import GBIT, bandwidth_from_rtt
from planner.linkpred.controls import FormulaModel, ProviderMedianModel
from planner.linkpred.controls_base import distance_km
from planner.linkpred.graph import SiteGraph, Source
from planner.linkpred.models import MODELS, chosen_model



@pytest.fixture(autouse=True)
def _openmp_threads(monkeypatch):
    # scikit-learn otherwise runs lscpu once to count physical cores (a process).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


CONTROLS = ["formula", "provider median", "distance", "vivaldi", "matrix", "boosted"]


def _graph(sites: int = 24, seed: int = 3, *, located: bool = True, providers: bool = True,
           throughput: bool = True) -> SiteGraph:
    """Every pair of ``sites`` measured: RTT from distance, throughput the smaller of the two
    ends' caps scaled down with RTT."""
    rng = np.random.default_rng(seed)
    lat, lon = rng.uniform(-50, 60, sites), rng.uniform(-120, 140, sites)
    provider = tuple(("aws", "gcp", "azure")[k % 3] if providers else "" for k in range(sites))
    i, j = np.triu_indices(sites, k=1)
    probe = SiteGraph(tuple(f"s{k}" for k in range(sites)), provider, lat, lon,
                      np.zeros(sites), i, j, np.zeros(len(i)), np.zeros(len(i)))
    rtt = 2 + distance_km(probe)[i, j] / 100 * rng.uniform(1.0, 1.4, len(i))
    cap = rng.lognormal(1.5, 0.5, sites)
    gbps = np.minimum(cap[i], cap[j]) / (1 + rtt / 200)
    nan = np.full(sites, np.nan)
    return SiteGraph(probe.sites, provider, lat if located else nan, lon if located else nan,
                     np.zeros(sites), i, j, rtt, gbps if throughput else np.full(len(i), np.nan))


def _hide(graph: SiteGraph, share: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(len(graph.i)) >= share


def _held_out_error(name: str, graph: SiteGraph, keep: np.ndarray, quantity: str) -> float:
    with threadpool_limits(1):
        prediction = MODELS[name].fit(graph.masked(keep), seed=0).predict(graph.masked(keep))
    a, b = graph.i[~keep], graph.j[~keep]
    if quantity == "gbps":
        return float(np.median(np.abs(np.log(prediction.gbps[a, b] / graph.gbps[~keep]))))
    return float(np.median(np.abs(np.log(prediction.rtt_ms[a, b] / graph.rtt_ms[~keep]))))


@pytest.mark.parametrize("name", CONTROLS)
def test_every_control_keeps_measured_pairs_and_bounds_on_the_safe_side(name):
    graph = _graph()
    keep = _hide(graph, 0.5)
    train = graph.masked(keep)
    with threadpool_limits(1):
        first = MODELS[name].fit(train, seed=1).predict(train)
        again = MODELS[name].fit(train, seed=1).predict(train)
    assert first.model == name and first.sites == graph.sites
    a, b = train.i, train.j
    assert np.array_equal(first.gbps[a, b], train.gbps) and np.array_equal(first.rtt_ms[a, b],
                                                                          train.rtt_ms)
    assert np.all(first.gbps_source[a, b] == Source.MEASURED)
    assert np.all(first.gbps_lo[a, b] == train.gbps)
    hidden_a, hidden_b = graph.i[~keep], graph.j[~keep]
    expected = Source.FORMULA if name == "formula" else Source.PREDICTED
    assert np.all(first.gbps_source[hidden_a, hidden_b] == expected)
    assert np.all(first.rtt_source[hidden_a, hidden_b] == expected)
    off = ~np.eye(graph.n_sites, dtype=bool)
    for point, bound, direction in ((first.gbps, first.gbps_lo, -1),
                                    (first.rtt_ms, first.rtt_hi_ms, 1)):
        assert np.all(np.isfinite(point[off])) and np.all(point[off] > 0)
        assert np.array_equal(point, point.T, equal_nan=True)
        assert np.all(direction * (bound[off] - point[off]) >= 0)
    if name != "formula":       # a learned bound is wider than its point somewhere
        assert np.any(first.gbps_lo[hidden_a, hidden_b] < first.gbps[hidden_a, hidden_b])
    for x, y in zip((first.rtt_ms, first.rtt_hi_ms, first.gbps, first.gbps_lo),
                    (again.rtt_ms, again.rtt_hi_ms, again.gbps, again.gbps_lo)):
        assert np.array_equal(x, y, equal_nan=True)


@pytest.mark.parametrize("name", CONTROLS)
def test_every_control_copes_with_no_places_no_providers_and_no_throughput(name):
    graph = _graph(located=False, providers=False, throughput=False)
    train = graph.masked(_hide(graph, 0.5))
    with threadpool_limits(1):
        prediction = MODELS[name].fit(train, seed=0).predict(train)
    off = ~np.eye(graph.n_sites, dtype=bool)
    assert np.all(np.isfinite(prediction.rtt_ms[off])) and np.all(prediction.gbps[off] > 0)
    assert np.all(prediction.gbps_source[off] == Source.FORMULA)
    window = bandwidth_from_rtt(prediction.rtt_ms[off]) / GBIT
    assert np.allclose(prediction.gbps[off], window)


def test_formula_is_the_relay_and_the_window_formula():
    sites = ("a", "b", "c")
    graph = SiteGraph(sites, ("",) * 3, np.full(3, np.nan), np.full(3, np.nan), np.zeros(3),
                      np.array([0, 1]), np.array([1, 2]), np.array([10.0, 20.0]),
                      np.array([3.0, np.nan]))
    prediction = FormulaModel().fit(graph).predict(graph)
    assert prediction.rtt_ms[0, 2] == prediction.rtt_hi_ms[0, 2] == 30.0
    assert prediction.gbps[0, 2] == pytest.approx(80.0 / 30.0)
    assert prediction.gbps[0, 1] == 3.0 and prediction.gbps[1, 2] == 4.0     # 80 / 20 ms


def test_provider_median_takes_its_provider_pairs_median_else_the_global_one():
    sites = ("aws:1", "aws:2", "gcp:1", "gcp:2", "azure:1")
    provider = ("aws", "aws", "gcp", "gcp", "azure")
    i, j = np.array([0, 0, 1, 2]), np.array([2, 3, 2, 3])
    graph = SiteGraph(sites, provider, np.full(5, np.nan), np.full(5, np.nan), np.zeros(5), i, j,
                      np.array([10.0, 20.0, 40.0, 5.0]), np.array([1.0, 2.0, 4.0, 9.0]))
    prediction = ProviderMedianModel().fit(graph).predict(graph)
    assert prediction.gbps[1, 3] == pytest.approx(2.0)          # aws-gcp: median of 1, 2, 4
    assert prediction.rtt_ms[1, 3] == pytest.approx(20.0)
    assert prediction.gbps[0, 4] == pytest.approx(np.exp(np.median(np.log([1, 2, 4, 9]))))


@pytest.mark.parametrize("name, quantity, better_than", [
    ("distance", "rtt", "provider median"),
    ("vivaldi", "rtt", "provider median"),
    ("matrix", "gbps", "provider median"),
    ("boosted", "gbps", "provider median"),
])
def test_each_control_beats_the_provider_median_where_its_idea_holds(name, quantity,
                                                                      better_than):
    """RTT follows distance (distance, Vivaldi); throughput is the smaller of two per-site caps
    (matrix completion, boosted trees with per-site means)."""
    graph = _graph(sites=30)
    keep = _hide(graph, 0.5)
    assert _held_out_error(name, graph, keep, quantity) < 0.6 * _held_out_error(
        better_than, graph, keep, quantity)


def test_chosen_model_is_registered():
    assert chosen_model() in MODELS.values()
