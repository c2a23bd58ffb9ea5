"""The learned link-prediction controls: low-rank matrix completion (soft-impute) and a
gradient-boosted model on pair features (scikit-learn's HistGradientBoostingRegressor with the
quantile loss). Each is a LinkModel (planner/linkpred/graph.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.linkpred.controls_base import (FittedPoint, LogMatrices, assemble, distance_km,
                                            fill_medians, residual_offsets)
from planner.linkpred.graph import HIGH_QUANTILE, LOW_QUANTILE, LinkPrediction, SiteGraph

# ------------------------------------------------------------------- matrix completion

SOFT_IMPUTE_STEPS = 60
SOFT_IMPUTE_TOLERANCE = 1e-4
# Shrinkage as shares of the largest eigenvalue of the centred observed matrix, tried from the
# strongest down (warm starts); the one with the least error on a seeded tenth of the measured
# pairs is kept.
SHRINK_GRID = (0.4, 0.2, 0.1, 0.05)
VALIDATION_SHARE = 0.1
MIN_VALIDATION_PAIRS = 5


def _soft_impute(observed: np.ndarray, mask: np.ndarray, shrink: float,
                 start: np.ndarray | None = None) -> np.ndarray:
    """Symmetric soft-impute: the low-rank Z that, with the observed entries filled in, has its
    eigenvalues shrunk towards 0 by ``shrink`` (the matrix is symmetric: an eigh per step)."""
    z = np.zeros_like(observed) if start is None else start
    for _ in range(SOFT_IMPUTE_STEPS):
        filled = np.where(mask, observed, z)
        values, vectors = np.linalg.eigh(filled)
        kept = np.sign(values) * np.maximum(np.abs(values) - shrink, 0.0)
        new = (vectors * kept) @ vectors.T
        change = np.linalg.norm(new - z) / max(np.linalg.norm(z), 1e-12)
        z = new
        if change < SOFT_IMPUTE_TOLERANCE:
            break
    return z


def _log_matrix(graph: SiteGraph, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The centred S x S log matrix of positive ``values``, its mask, and the centre."""
    s = graph.n_sites
    ok = values > 0
    logs = np.log(values[ok])
    centre = float(np.mean(logs)) if len(logs) else 0.0
    observed = np.zeros((s, s))
    mask = np.zeros((s, s), dtype=bool)
    observed[graph.i[ok], graph.j[ok]] = observed[graph.j[ok], graph.i[ok]] = logs - centre
    mask[graph.i[ok], graph.j[ok]] = mask[graph.j[ok], graph.i[ok]] = True
    return observed, mask, centre


def choose_shrink(graph: SiteGraph, values: np.ndarray, seed: int) -> float:
    """The SHRINK_GRID share (times the top eigenvalue) with the least error on a seeded
    validation tenth of the measured pairs; the middle of the grid when too few pairs."""
    observed, mask, _ = _log_matrix(graph, values)
    top = float(np.max(np.abs(np.linalg.eigvalsh(observed)))) if mask.any() else 0.0
    ok = np.flatnonzero(values > 0)
    held_count = int(len(ok) * VALIDATION_SHARE)
    if held_count < MIN_VALIDATION_PAIRS:
        return top * SHRINK_GRID[len(SHRINK_GRID) // 2]
    held = np.random.default_rng(seed).choice(ok, size=held_count, replace=False)
    a, b = graph.i[held], graph.j[held]
    train = mask.copy()
    train[a, b] = train[b, a] = False
    best, best_error, z = top * SHRINK_GRID[0], np.inf, None
    for share in SHRINK_GRID:
        z = _soft_impute(observed, train, top * share, z)
        error = float(np.mean((z[a, b] - observed[a, b]) ** 2))
        if error < best_error:
            best, best_error = top * share, error
    return best


def matrix_point(graph: SiteGraph, seed: int, shrink: tuple[float, float] | None = None
                 ) -> LogMatrices:
    """Soft-impute completion of the log RTT and log throughput matrices; ``shrink`` per
    quantity (chosen on a validation tenth when None)."""
    out = []
    for k, values in enumerate((graph.rtt_ms, graph.gbps)):
        observed, mask, centre = _log_matrix(graph, values)
        if not mask.any():
            out.append(np.full(observed.shape, np.nan))
            continue
        level = choose_shrink(graph, values, seed) if shrink is None else shrink[k]
        z = _soft_impute(observed, mask, level)
        out.append((z + z.T) / 2 + centre)
    return out[0], out[1]


@dataclass(frozen=True)
class MatrixModel:
    """Low-rank completion of log throughput and log RTT (soft-impute, shrinkage chosen on a
    seeded validation tenth); bounds from out-of-fold residuals at the chosen shrinkage."""

    name: str = "matrix"

    def fit(self, graph: SiteGraph, seed: int = 0) -> FittedPoint:
        shrink = (choose_shrink(graph, graph.rtt_ms, seed), choose_shrink(graph, graph.gbps, seed))

        def fixed(g: SiteGraph, s: int) -> LogMatrices:
            return matrix_point(g, s, shrink)

        point = fill_medians(graph, fixed(graph, seed))
        offsets = residual_offsets(graph, fixed, seed, point)
        return FittedPoint(self.name, point[0], point[1], offsets, bool(np.any(graph.gbps > 0)))


# -------------------------------------------------------------------------- boosted trees

BOOSTED_SETTINGS = {"max_iter": 150, "learning_rate": 0.08, "min_samples_leaf": 10,
                    "early_stopping": False}


def _site_means(graph: SiteGraph, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per site, the sum and count of the log of its measured positive ``values``."""
    s = graph.n_sites
    ok = values > 0
    logs = np.log(values[ok])
    total, count = np.zeros(s), np.zeros(s)
    for ends in (graph.i[ok], graph.j[ok]):
        np.add.at(total, ends, logs)
        np.add.at(count, ends, 1)
    return total, count


def pair_features(graph: SiteGraph, a: np.ndarray, b: np.ndarray, own: np.ndarray | None,
                  log_rtt: np.ndarray | None) -> np.ndarray:
    """Symmetric features of pairs (a, b): provider pair, same provider, log distance, each end's
    mean measured log RTT and log throughput (min and max of the two ends; a training pair's
    own figures left out: ``own`` is its index into the graph's pairs, -1 for others), each
    end's degree, and, for throughput, the pair's log RTT."""
    names = sorted(set(graph.provider))
    code = np.array([names.index(p) for p in graph.provider], dtype=np.int64)
    k = len(names)
    pa, pb = code[a], code[b]
    columns = [(np.minimum(pa, pb) * k + np.maximum(pa, pb)).astype(float),
               (pa == pb).astype(float),
               np.log(np.maximum(distance_km(graph)[a, b], 1.0))]
    degree = np.zeros(graph.n_sites)
    np.add.at(degree, graph.i, 1)
    np.add.at(degree, graph.j, 1)
    for values in (graph.rtt_ms, graph.gbps):
        total, count = _site_means(graph, values)
        end_means = []
        for end in (a, b):
            t, c = total[end].copy(), count[end].copy()
            if own is not None:
                mine = own >= 0
                figure = np.where(mine, values[np.maximum(own, 0)], np.nan)
                drop = mine & (figure > 0)
                t[drop] -= np.log(figure[drop])
                c[drop] -= 1
            with np.errstate(invalid="ignore", divide="ignore"):
                end_means.append(np.where(c > 0, t / c, np.nan))
        columns += [np.fmin(*end_means), np.fmax(*end_means)]
    columns += [np.minimum(degree[a], degree[b]), np.maximum(degree[a], degree[b])]
    if log_rtt is not None:
        columns.append(log_rtt)
    return np.column_stack(columns)


def _fit_predict(x: np.ndarray, y: np.ndarray, x_all: np.ndarray, quantile: float,
                 seed: int) -> np.ndarray:
    """The ``quantile`` of y fitted on x, predicted at x_all. A feature no training row has
    (no places, no throughput anywhere) is dropped: the trees cannot bin an empty column."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    known = ~np.all(np.isnan(x), axis=0)
    model = HistGradientBoostingRegressor(loss="quantile", quantile=quantile,
                                          categorical_features=[0], random_state=seed,
                                          **BOOSTED_SETTINGS)
    return model.fit(x[:, known], y).predict(x_all[:, known])


@dataclass(frozen=True)
class FittedBoosted:
    name: str
    rtt: np.ndarray
    rtt_hi: np.ndarray
    gbps: np.ndarray
    gbps_lo: np.ndarray

    def predict(self, graph: SiteGraph) -> LinkPrediction:
        return assemble(self.name, graph, self.rtt, self.rtt_hi, self.gbps, self.gbps_lo)


@dataclass(frozen=True)
class BoostedModel:
    """Gradient-boosted trees on pair features, one per quantile: RTT at 0.5 and HIGH_QUANTILE,
    then throughput at 0.5 and LOW_QUANTILE with the pair's RTT (measured, else the RTT
    model's median) among the features."""

    name: str = "boosted"

    def fit(self, graph: SiteGraph, seed: int = 0) -> FittedBoosted:
        s = graph.n_sites
        a, b = np.triu_indices(s, k=1)
        every = pair_features(graph, a, b, None, None)
        rtt = np.full((s, s), np.nan)
        rtt_hi = np.full((s, s), np.nan)
        has_rtt = graph.rtt_ms > 0
        if has_rtt.any():
            rows = np.flatnonzero(has_rtt)
            x = pair_features(graph, graph.i[rows], graph.j[rows], rows, None)
            y = np.log(graph.rtt_ms[rows])
            for out, q in ((rtt, 0.5), (rtt_hi, HIGH_QUANTILE)):
                out[a, b] = out[b, a] = np.exp(_fit_predict(x, y, every, q, seed))
        else:
            rtt[:] = rtt_hi[:] = np.inf
        measured_log_rtt = np.full((s, s), np.nan)
        measured_log_rtt[graph.i[has_rtt], graph.j[has_rtt]] = np.log(graph.rtt_ms[has_rtt])
        measured_log_rtt[graph.j[has_rtt], graph.i[has_rtt]] = np.log(graph.rtt_ms[has_rtt])
        with np.errstate(divide="ignore"):
            pair_log_rtt = np.where(np.isfinite(measured_log_rtt), measured_log_rtt, np.log(rtt))
        gbps = np.full((s, s), np.nan)
        gbps_lo = np.full((s, s), np.nan)
        has_bw = graph.gbps > 0
        if has_bw.any():
            rows = np.flatnonzero(has_bw)
            x = pair_features(graph, graph.i[rows], graph.j[rows], rows,
                              pair_log_rtt[graph.i[rows], graph.j[rows]])
            y = np.log(graph.gbps[rows])
            x_all = np.column_stack([every, pair_log_rtt[a, b]])
            for out, q in ((gbps, 0.5), (gbps_lo, LOW_QUANTILE)):
                out[a, b] = out[b, a] = np.exp(_fit_predict(x, y, x_all, q, seed))
        return FittedBoosted(self.name, rtt, rtt_hi, gbps, gbps_lo)
