"""What every link-prediction control shares: today's rule (relay + window formula), measured
pairs as matrices, bounds from out-of-fold residuals, and the assembly of a LinkPrediction.

A control predicts log RTT and log throughput for every site pair (point figures). Its
conservative figures are the point plus a quantile of the residuals it makes on measured pairs
it did not see (K folds of the training pairs), so a control that fits its training pairs well
but generalises badly still gets wide bounds. Measured figures always win over predictions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from planner.core.fleet import GBIT, bandwidth_from_rtt
from planner.linkpred.graph import (HIGH_QUANTILE, LOW_QUANTILE, LinkPrediction, SiteGraph,
                                    Source)

FOLDS = 4
MIN_FOLD_PAIRS = 8      # fewer measured figures than this: bounds from in-sample residuals
KM_PER_DEGREE = 111.195

# log RTT (ms) and log throughput (Gbit/s) for every pair, S x S each; NaN where the control has
# nothing to say (then the global median of the training figures stands in).
LogMatrices = tuple[np.ndarray, np.ndarray]
PointFitter = Callable[[SiteGraph, int], LogMatrices]


def window_gbps(rtt_ms: np.ndarray) -> np.ndarray:
    """The one-window TCP formula in Gbit/s (planner.core.fleet.bandwidth_from_rtt); 0 where
    the RTT is infinite."""
    rtt = np.asarray(rtt_ms, dtype=float)
    finite = np.isfinite(rtt)
    return np.where(finite, bandwidth_from_rtt(np.where(finite, rtt, 1e18)) / GBIT, 0.0)


def measured_matrices(graph: SiteGraph) -> tuple[np.ndarray, np.ndarray]:
    """S x S RTT and throughput of the measured pairs, NaN elsewhere (diagonal included)."""
    s = graph.n_sites
    rtt = np.full((s, s), np.nan)
    gbps = np.full((s, s), np.nan)
    for out, values in ((rtt, graph.rtt_ms), (gbps, graph.gbps)):
        out[graph.i, graph.j] = values
        out[graph.j, graph.i] = values
    gbps[~(gbps > 0)] = np.nan
    rtt[~(rtt >= 0)] = np.nan
    return rtt, gbps


def relay_rtt(graph: SiteGraph) -> np.ndarray:
    """Shortest paths over the measured RTTs (today's rule): inf between components, 0 on the
    diagonal."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    s = graph.n_sites
    has = np.isfinite(graph.rtt_ms)
    if not has.any():
        out = np.full((s, s), np.inf)
        np.fill_diagonal(out, 0.0)
        return out
    # A zero-RTT measurement would vanish from a sparse matrix: keep it as a tiny positive cost.
    weight = np.maximum(graph.rtt_ms[has], 1e-9)
    matrix = csr_matrix((weight, (graph.i[has], graph.j[has])), shape=(s, s))
    return dijkstra(matrix, directed=False)


def distance_km(graph: SiteGraph) -> np.ndarray:
    """Great-circle distance between every two sites, NaN where either is not located."""
    lat, lon = np.radians(graph.latitude), np.radians(graph.longitude)
    dlat = lat[:, None] - lat[None, :]
    dlon = lon[:, None] - lon[None, :]
    h = np.sin(dlat / 2) ** 2 + np.cos(lat[:, None]) * np.cos(lat[None, :]) * np.sin(dlon / 2) ** 2
    return 2 * 6371.0 * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))


def fold_of(n: int, seed: int, folds: int = FOLDS) -> np.ndarray:
    """A seeded fold number per measured pair."""
    rng = np.random.default_rng(seed)
    return rng.permutation(n) % folds


@dataclass(frozen=True)
class Offsets:
    """Residual quantiles on log scale: log RTT hi = point + rtt_hi, log Gbit/s lo = point +
    gbps_lo (a negative number)."""

    rtt_hi: float
    gbps_lo: float


def residual_offsets(graph: SiteGraph, fitter: PointFitter, seed: int,
                     point: LogMatrices) -> Offsets:
    """The HIGH_QUANTILE of log RTT residuals and LOW_QUANTILE of log throughput residuals on
    measured pairs each fold's fit did not see (in-sample when too few pairs)."""
    n = len(graph.i)
    res_rtt: list[np.ndarray] = []
    res_bw: list[np.ndarray] = []
    if n >= MIN_FOLD_PAIRS:
        fold = fold_of(n, seed)
        for f in range(FOLDS):
            held = fold == f
            if not held.any() or held.all():
                continue
            log_rtt, log_bw = fill_medians(graph.masked(~held), fitter(graph.masked(~held), seed))
            res_rtt.append(_residuals(log_rtt, graph, held, graph.rtt_ms))
            res_bw.append(_residuals(log_bw, graph, held, graph.gbps))
    else:
        everything = np.ones(n, dtype=bool)
        res_rtt.append(_residuals(point[0], graph, everything, graph.rtt_ms))
        res_bw.append(_residuals(point[1], graph, everything, graph.gbps))
    rtt = np.concatenate(res_rtt) if res_rtt else np.empty(0)
    bw = np.concatenate(res_bw) if res_bw else np.empty(0)
    return Offsets(float(np.quantile(rtt, HIGH_QUANTILE)) if len(rtt) else 0.0,
                   float(np.quantile(bw, LOW_QUANTILE)) if len(bw) else 0.0)


def _residuals(log_pred: np.ndarray, graph: SiteGraph, rows: np.ndarray,
               truth: np.ndarray) -> np.ndarray:
    """log(true) - log(predicted) over ``rows`` of the graph's pairs with a positive figure."""
    value = truth[rows]
    ok = value > 0
    pred = log_pred[graph.i[rows][ok], graph.j[rows][ok]]
    out = np.log(value[ok]) - pred
    return out[np.isfinite(out)]


def global_log_medians(graph: SiteGraph) -> tuple[float, float]:
    """Median log RTT and log throughput of the measured pairs (NaN where none)."""
    rtt = graph.rtt_ms[graph.rtt_ms > 0]
    bw = graph.gbps[graph.gbps > 0]
    return (float(np.median(np.log(rtt))) if len(rtt) else np.nan,
            float(np.median(np.log(bw))) if len(bw) else np.nan)


def fill_medians(graph: SiteGraph, point: LogMatrices) -> LogMatrices:
    """Non-finite predictions replaced by the graph's global median log figures."""
    med_rtt, med_bw = global_log_medians(graph)
    log_rtt, log_bw = point
    return (np.where(np.isfinite(log_rtt), log_rtt, med_rtt),
            np.where(np.isfinite(log_bw), log_bw, med_bw))


def assemble(name: str, graph: SiteGraph, rtt: np.ndarray, rtt_hi: np.ndarray,
             gbps: np.ndarray, gbps_lo: np.ndarray, source: Source = Source.PREDICTED
             ) -> LinkPrediction:
    """A LinkPrediction from a control's matrices: measured figures override them; throughput
    a control could not predict (no measured throughput anywhere, or NaN) takes the window
    formula of the pair's RTT, marked FORMULA; the diagonal is NaN (completion fills a site
    with itself)."""
    s = graph.n_sites
    rtt, rtt_hi = np.array(rtt, dtype=float), np.array(rtt_hi, dtype=float)
    gbps, gbps_lo = np.array(gbps, dtype=float), np.array(gbps_lo, dtype=float)
    rtt_source = np.full((s, s), int(source), dtype=np.uint8)
    gbps_source = np.full((s, s), int(source), dtype=np.uint8)

    m_rtt, m_bw = measured_matrices(graph)
    has_rtt, has_bw = np.isfinite(m_rtt), np.isfinite(m_bw)
    rtt[has_rtt] = rtt_hi[has_rtt] = m_rtt[has_rtt]
    rtt_source[has_rtt] = Source.MEASURED
    rtt_hi = np.maximum(rtt_hi, rtt)

    missing_bw = ~np.isfinite(gbps) | ~np.isfinite(gbps_lo)
    missing_bw &= ~has_bw
    if missing_bw.any():
        gbps[missing_bw] = window_gbps(rtt)[missing_bw]
        gbps_lo[missing_bw] = window_gbps(rtt_hi)[missing_bw]
        gbps_source[missing_bw] = Source.FORMULA
    gbps[has_bw] = gbps_lo[has_bw] = m_bw[has_bw]
    gbps_source[has_bw] = Source.MEASURED
    gbps_lo = np.minimum(gbps_lo, gbps)

    upper = np.triu_indices(s, k=1)
    for arr in (rtt, rtt_hi, gbps, gbps_lo, rtt_source, gbps_source):
        arr.T[upper] = arr[upper]     # exactly symmetric, whatever rounding a control did
    for arr in (rtt, rtt_hi, gbps, gbps_lo):
        np.fill_diagonal(arr, np.nan)
    for arr in (rtt_source, gbps_source):
        np.fill_diagonal(arr, Source.MEASURED)
    return LinkPrediction(name, graph.sites, rtt, rtt_hi, gbps, gbps_lo, rtt_source,
                          gbps_source)


@dataclass(frozen=True)
class FittedPoint:
    """A control fitted: point log matrices and residual offsets, turned into a prediction."""

    name: str
    log_rtt: np.ndarray
    log_gbps: np.ndarray
    offsets: Offsets
    has_gbps: bool

    def predict(self, graph: SiteGraph) -> LinkPrediction:
        rtt = np.exp(self.log_rtt)
        rtt_hi = np.exp(self.log_rtt + self.offsets.rtt_hi)
        if self.has_gbps:
            gbps = np.exp(self.log_gbps)
            gbps_lo = np.exp(self.log_gbps + self.offsets.gbps_lo)
        else:
            gbps = gbps_lo = np.full(rtt.shape, np.nan)
        return assemble(self.name, graph, rtt, rtt_hi, gbps, gbps_lo)


@dataclass(frozen=True)
class PointControl:
    """A control given by a point fitter; bounds from out-of-fold residuals."""

    name: str
    fitter: PointFitter

    def fit(self, graph: SiteGraph, seed: int = 0) -> FittedPoint:
        point = fill_medians(graph, self.fitter(graph, seed))
        offsets = residual_offsets(graph, self.fitter, seed, point)
        has_gbps = bool(np.any(graph.gbps > 0))
        log_rtt = point[0]
        if not np.any(np.isfinite(graph.rtt_ms)):
            # Nothing measured to learn RTT from: today's rule (relay over nothing: unreachable).
            log_rtt = np.log(relay_rtt(graph))
        return FittedPoint(self.name, log_rtt, point[1], offsets, has_gbps)
