"""The graph-network link predictor: what every link model promises (shapes, symmetry, measured
pairs kept, bounds on the conservative side, seeded), that it learns a signal that lives on the
graph, that a stored model predicts the same, and that it falls back to the formula."""

import numpy as np
import pytest

from planner.core.fleet import GBIT, bandwidth_from_rtt
from planner.linkpred.gnn import GnnConfig, GnnLinkModel, load_fitted
from planner.linkpred.gnn_fit import great_circle_km
from planner.linkpred.graph import SiteGraph, Source

QUICK = GnnLinkModel(GnnConfig(max_epochs=120))


def _network(sites: int = 30, seed: int = 5) -> SiteGraph:
    """Every pair of ``sites`` known: RTT from distance; throughput the smaller of the two
    sites' egress caps (a per-site figure no pair feature carries) falling with RTT."""
    rng = np.random.default_rng(seed)
    lat, lon = rng.uniform(-40, 60, sites), rng.uniform(-120, 140, sites)
    provider = tuple(("aws", "gcp", "azure")[k % 3] for k in range(sites))
    i, j = np.triu_indices(sites, k=1)
    probe = SiteGraph(tuple(f"s{k}" for k in range(sites)), provider, lat, lon,
                      np.full(sites, 8.0), i, j, np.zeros(len(i)), np.zeros(len(i)))
    rtt = 2 + great_circle_km(probe, i, j) / 100 * rng.uniform(1.1, 1.4, len(i))
    cap = np.exp(rng.normal(1.5, 0.8, sites))
    gbps = np.minimum(cap[i], cap[j]) / (1 + rtt / 300) * np.exp(rng.normal(0, 0.05, len(i)))
    return SiteGraph(probe.sites, provider, lat, lon, probe.gpus, i, j, rtt, gbps)


def _hidden(graph: SiteGraph, share: float, seed: int = 0) -> np.ndarray:
    keep = np.ones(len(graph.i), dtype=bool)
    rng = np.random.default_rng(seed)
    keep[rng.permutation(len(keep))[:int(share * len(keep))]] = False
    return keep


@pytest.fixture(scope="module")
def split():
    truth = _network()
    keep = _hidden(truth, 0.5)
    graph = truth.masked(keep)
    fitted = QUICK.fit(graph, seed=1)
    return truth, keep, graph, fitted, fitted.predict(graph)


def test_prediction_covers_every_pair_symmetric_with_a_nan_diagonal(split):
    _, _, graph, _, prediction = split
    s = graph.n_sites
    assert prediction.model == "gnn" and prediction.sites == graph.sites
    off = ~np.eye(s, dtype=bool)
    for m in (prediction.rtt_ms, prediction.rtt_hi_ms, prediction.gbps, prediction.gbps_lo):
        assert m.shape == (s, s)
        assert np.array_equal(m, m.T, equal_nan=True)
        assert np.isnan(np.diag(m)).all() and (m[off] > 0).all() and np.isfinite(m[off]).all()
    assert set(np.unique(prediction.gbps_source[off])) == {Source.MEASURED, Source.PREDICTED}


def test_measured_pairs_keep_their_figures_and_bounds_sit_on_the_conservative_side(split):
    _, _, graph, _, prediction = split
    assert np.allclose(prediction.gbps[graph.i, graph.j], graph.gbps)
    assert np.allclose(prediction.gbps_lo[graph.i, graph.j], graph.gbps)
    assert np.allclose(prediction.rtt_ms[graph.i, graph.j], graph.rtt_ms)
    assert (prediction.gbps_source[graph.i, graph.j] == Source.MEASURED).all()
    assert (prediction.rtt_source[graph.i, graph.j] == Source.MEASURED).all()
    off = ~np.eye(graph.n_sites, dtype=bool)
    assert (prediction.gbps_lo[off] <= prediction.gbps[off]).all()
    assert (prediction.rtt_hi_ms[off] >= prediction.rtt_ms[off]).all()
    predicted = prediction.gbps_source == Source.PREDICTED
    assert (prediction.gbps_lo[predicted] < prediction.gbps[predicted]).mean() > 0.9


def test_learns_per_site_throughput_far_better_than_the_global_median(split):
    truth, keep, graph, _, prediction = split
    hidden = ~keep
    a, b, true = truth.i[hidden], truth.j[hidden], truth.gbps[hidden]
    gnn_p90 = np.quantile(np.abs(np.log(prediction.gbps[a, b] / true)), 0.9)
    median_p90 = np.quantile(np.abs(np.log(np.median(graph.gbps) / true)), 0.9)
    assert gnn_p90 < 0.6 * median_p90
    rtt_p90 = np.quantile(np.abs(np.log(prediction.rtt_ms[a, b] / truth.rtt_ms[hidden])), 0.9)
    assert rtt_p90 < 0.5 * np.quantile(
        np.abs(np.log(np.median(graph.rtt_ms) / truth.rtt_ms[hidden])), 0.9)


def test_the_same_seed_gives_the_same_prediction_and_another_seed_another(split):
    _, _, graph, _, prediction = split
    again = QUICK.fit(graph, seed=1).predict(graph)
    assert np.array_equal(again.gbps, prediction.gbps, equal_nan=True)
    assert np.array_equal(again.rtt_hi_ms, prediction.rtt_hi_ms, equal_nan=True)
    other = QUICK.fit(graph, seed=2).predict(graph)
    assert not np.array_equal(other.gbps, prediction.gbps, equal_nan=True)


def test_a_stored_model_predicts_the_same(split):
    _, _, graph, fitted, prediction = split
    loaded = load_fitted(fitted.to_bytes())
    again = loaded.predict(graph)
    for name in ("rtt_ms", "rtt_hi_ms", "gbps", "gbps_lo", "rtt_source", "gbps_source"):
        assert np.array_equal(getattr(again, name), getattr(prediction, name), equal_nan=True)


def test_a_measured_rtt_without_throughput_is_kept_and_informs_the_throughput(split):
    truth, keep, graph, fitted, _ = split
    rtt_only = graph.gbps.copy()
    rtt_only[:5] = np.nan
    partial = SiteGraph(graph.sites, graph.provider, graph.latitude, graph.longitude,
                        graph.gpus, graph.i, graph.j, graph.rtt_ms, rtt_only)
    prediction = fitted.predict(partial)
    a, b = graph.i[:5], graph.j[:5]
    assert np.allclose(prediction.rtt_ms[a, b], graph.rtt_ms[:5])
    assert (prediction.rtt_source[a, b] == Source.MEASURED).all()
    assert (prediction.gbps_source[a, b] == Source.PREDICTED).all()


def test_no_measured_throughput_gives_the_window_formula():
    graph = _network(sites=16)
    keep = _hidden(graph, 0.4)
    no_gbps = SiteGraph(graph.sites, graph.provider, graph.latitude, graph.longitude,
                        graph.gpus, graph.i[keep], graph.j[keep], graph.rtt_ms[keep],
                        np.full(int(keep.sum()), np.nan))
    prediction = GnnLinkModel(GnnConfig(max_epochs=40)).fit(no_gbps, seed=0).predict(no_gbps)
    off = ~np.eye(graph.n_sites, dtype=bool)
    assert (prediction.gbps_source[off] == Source.FORMULA).all()
    assert np.allclose(prediction.gbps[off], bandwidth_from_rtt(prediction.rtt_ms[off]) / GBIT)
    unmeasured = off & (prediction.rtt_source != Source.MEASURED)
    assert unmeasured.any() and (prediction.rtt_source[unmeasured] == Source.PREDICTED).all()


def test_too_few_measured_pairs_fall_back_to_relay_and_formula():
    graph = _network(sites=6)
    few = graph.masked(np.arange(len(graph.i)) < 3)
    prediction = QUICK.fit(few, seed=0).predict(few)
    unmeasured = ~np.eye(6, dtype=bool) & (prediction.rtt_source != Source.MEASURED)
    assert (prediction.rtt_source[unmeasured] == Source.FORMULA).all()
    assert (prediction.gbps_source[unmeasured] == Source.FORMULA).all()


def test_sites_without_a_place_or_provider_still_get_figures():
    graph = _network(sites=20)
    nan = np.full(graph.n_sites, np.nan)
    anonymous = SiteGraph(graph.sites, ("",) * graph.n_sites, nan, nan.copy(),
                          np.zeros(graph.n_sites), graph.i, graph.j, graph.rtt_ms, graph.gbps)
    anonymous = anonymous.masked(_hidden(anonymous, 0.5))
    prediction = GnnLinkModel(GnnConfig(max_epochs=40)).fit(anonymous, 0).predict(anonymous)
    off = ~np.eye(graph.n_sites, dtype=bool)
    assert np.isfinite(prediction.gbps[off]).all() and np.isfinite(prediction.rtt_hi_ms[off]).all()
