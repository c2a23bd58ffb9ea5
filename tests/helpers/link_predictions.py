"""Link predictions and link models written by hand, for tests of what reads them (serve's link
model, completion, the dashboard): values chosen by the test, no fitting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from planner.linkpred.graph import LinkPrediction, SiteGraph, Source

# (rtt_ms, rtt_hi_ms, gbps, gbps_lo, source) of one site pair, or with two sources: the RTT's
# and the throughput's
Figures = tuple


def link_prediction(sites: Sequence[str], pairs: Mapping[tuple[str, str], Figures], *,
                    model: str = "stand-in",
                    other: Figures = (100.0, 100.0, 0.8, 0.8, Source.FORMULA)) -> LinkPrediction:
    """A prediction over ``sites``: ``pairs`` as given (either order), every other pair
    ``other``; the diagonal NaN and measured, as the models leave it."""
    s = len(sites)
    index = {site: k for k, site in enumerate(sites)}
    mats = [np.full((s, s), v, dtype=float) for v in other[:4]]
    sources = [np.full((s, s), int(other[4]), dtype=np.uint8),
               np.full((s, s), int(other[-1]), dtype=np.uint8)]
    for (a, b), figures in pairs.items():
        for i, j in ((index[a], index[b]), (index[b], index[a])):
            for mat, value in zip(mats, figures[:4]):
                mat[i, j] = value
            sources[0][i, j], sources[1][i, j] = int(figures[4]), int(figures[-1])
    for mat in mats:
        np.fill_diagonal(mat, np.nan)
    for source in sources:
        np.fill_diagonal(source, int(Source.MEASURED))
    return LinkPrediction(model, tuple(sites), *mats, *sources)


def site_graph_of(sites: Sequence[str],
                  measured: Mapping[tuple[str, str], tuple[float, float]]) -> SiteGraph:
    """A SiteGraph of ``sites`` (no place, no provider, no GPUs) measuring ``measured``:
    (a, b) -> (rtt_ms, gbps), NaN where not measured."""
    index = {site: k for k, site in enumerate(sites)}
    keys = sorted((min(index[a], index[b]), max(index[a], index[b]), rtt, gbps)
                  for (a, b), (rtt, gbps) in measured.items())
    column = lambda k, kind: np.array([row[k] for row in keys], dtype=kind)  # noqa: E731
    nan = np.full(len(sites), np.nan)
    return SiteGraph(tuple(sites), ("",) * len(sites), nan, nan.copy(), np.zeros(len(sites)),
                     column(0, np.int64), column(1, np.int64), column(2, float),
                     column(3, float))


class FixedLinkModel:
    """A LinkModel that predicts ``gbps`` and ``rtt_ms`` for every pair its graph did not
    measure (bounds: half the throughput, 1.5 times the RTT), the measured figures where it did.
    ``fits`` counts its fits; ``fail`` makes a fit raise."""

    def __init__(self, name: str, gbps: float, rtt_ms: float = 40.0, *, fail: bool = False):
        self.name, self.gbps, self.rtt_ms, self.fail = name, gbps, rtt_ms, fail
        self.fits = 0

    def fit(self, graph: SiteGraph, seed: int = 0) -> "FixedLinkModel":
        self.fits += 1
        if self.fail:
            raise RuntimeError("the fit diverged")
        return self

    def predict(self, graph: SiteGraph) -> LinkPrediction:
        pairs = {}
        for i, j, rtt, gbps in zip(graph.i, graph.j, graph.rtt_ms, graph.gbps):
            pairs[(graph.sites[i], graph.sites[j])] = (
                (rtt, rtt, gbps, gbps, Source.MEASURED) if np.isfinite(gbps) else
                (rtt, rtt, self.gbps, self.gbps / 2, Source.MEASURED, Source.PREDICTED))
        return link_prediction(graph.sites, pairs, model=self.name, other=(
            self.rtt_ms, self.rtt_ms * 1.5, self.gbps, self.gbps / 2, Source.PREDICTED))
