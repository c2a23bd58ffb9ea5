"""The simple link-prediction controls: today's rule, the provider-pair median, a distance
regression and Vivaldi coordinates (the matrix-completion and boosted controls are in
controls_learned.py). Each is a LinkModel (planner/linkpred/graph.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.linkpred.controls_base import (LogMatrices, PointControl, assemble, distance_km,
                                            relay_rtt)
from planner.linkpred.graph import LinkPrediction, SiteGraph, Source

# ------------------------------------------------------------------------------ today's rule


@dataclass(frozen=True)
class FittedFormula:
    name: str
    rtt: np.ndarray

    def predict(self, graph: SiteGraph) -> LinkPrediction:
        # No throughput given: assemble takes the window formula of each pair's RTT, measured
        # where it was, and keeps measured throughput.
        nothing = np.full(self.rtt.shape, np.nan)
        return assemble(self.name, graph, self.rtt, self.rtt, nothing, nothing, Source.FORMULA)


@dataclass(frozen=True)
class FormulaModel:
    """Today's completion (docs/COSTMODEL.md section 2): RTT by the shortest path over measured
    RTTs, throughput by the window formula of that RTT; the bounds are the point figures."""

    name: str = "formula"

    def fit(self, graph: SiteGraph, seed: int = 0) -> FittedFormula:
        return FittedFormula(self.name, relay_rtt(graph))


# ------------------------------------------------------------------------ provider-pair median

def _provider_codes(graph: SiteGraph) -> tuple[np.ndarray, int]:
    names = sorted(set(graph.provider))
    code = {p: k for k, p in enumerate(names)}
    return np.array([code[p] for p in graph.provider], dtype=np.int64), len(names)


def provider_median_point(graph: SiteGraph, seed: int) -> LogMatrices:
    """Per unordered provider pair, the median log figure of its measured site pairs; NaN for a
    provider pair with none (the global median then stands in)."""
    code, k = _provider_codes(graph)
    s = graph.n_sites
    out = []
    for values in (graph.rtt_ms, graph.gbps):
        ok = values > 0
        a, b = code[graph.i[ok]], code[graph.j[ok]]
        key = np.minimum(a, b) * k + np.maximum(a, b)
        logs = np.log(values[ok])
        table = np.full(k * k, np.nan)
        for group in np.unique(key):
            table[group] = float(np.median(logs[key == group]))
        lo, hi = np.minimum(code[:, None], code[None, :]), np.maximum(code[:, None], code[None, :])
        out.append(table[(lo * k + hi).reshape(s, s)])
    return out[0], out[1]


def ProviderMedianModel() -> PointControl:
    """The median of the same provider pair (fallback: the global median)."""
    return PointControl("provider median", provider_median_point)


# ---------------------------------------------------------------------- distance regression

DISTANCE_FLOOR_KM = 50.0    # sites in one metro: log distance would run to minus infinity


def _fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """Least squares y = a + b x (b = 0 when x does not vary); None without data."""
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.any():
        return None
    x, y = x[ok], y[ok]
    if len(x) < 2 or np.ptp(x) == 0:
        return float(np.mean(y)), 0.0
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def distance_point(graph: SiteGraph, seed: int) -> LogMatrices:
    """log RTT and log throughput, each a line in log great-circle distance; NaN where a site
    is not located (the global median stands in)."""
    log_d = np.log(np.maximum(distance_km(graph), DISTANCE_FLOOR_KM))
    x = log_d[graph.i, graph.j]
    out = []
    for values in (graph.rtt_ms, graph.gbps):
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(values > 0, np.log(values), np.nan)
        line = _fit_line(x, y)
        out.append(np.full(log_d.shape, np.nan) if line is None else line[0] + line[1] * log_d)
    return out[0], out[1]


def DistanceModel() -> PointControl:
    """Log-log regression of RTT and throughput on great-circle distance."""
    return PointControl("distance", distance_point)


# ------------------------------------------------------------------------------------ Vivaldi

VIVALDI_DIMENSIONS = 3
VIVALDI_STEPS = 400
VIVALDI_RATE = 0.05


def vivaldi_coordinates(graph: SiteGraph, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vivaldi coordinates with heights fitted to the measured RTTs: the predicted RTT of a
    pair is |x_a - x_b| + h_a + h_b. Minimises the squared relative error by Adam from a seeded
    start (full batch: deterministic). Returns (positions, heights, which sites had an RTT)."""
    s = graph.n_sites
    has = graph.rtt_ms > 0
    i, j, rtt = graph.i[has], graph.j[has], graph.rtt_ms[has]
    seen = np.zeros(s, dtype=bool)
    seen[i] = seen[j] = True
    rng = np.random.default_rng(seed)
    scale = float(np.median(rtt)) if len(rtt) else 1.0
    x = rng.normal(0.0, scale / 2, size=(s, VIVALDI_DIMENSIONS))
    h = np.full(s, scale * 0.05)
    if not len(rtt):
        return x, h, seen
    params = np.concatenate([x.ravel(), np.log(h)])
    m = np.zeros_like(params)
    v = np.zeros_like(params)
    beta1, beta2 = 0.9, 0.999
    for step in range(1, VIVALDI_STEPS + 1):
        pos = params[:s * VIVALDI_DIMENSIONS].reshape(s, VIVALDI_DIMENSIONS)
        height = np.exp(params[s * VIVALDI_DIMENSIONS:])
        diff = pos[i] - pos[j]
        dist = np.sqrt((diff ** 2).sum(axis=1) + 1e-9)
        pred = dist + height[i] + height[j]
        err = (pred - rtt) / rtt                   # relative error
        g = 2 * err / rtt / len(rtt)
        unit = diff / dist[:, None]
        pull = g[:, None] * unit
        g_pos = np.column_stack([np.bincount(i, pull[:, d], s) - np.bincount(j, pull[:, d], s)
                                 for d in range(VIVALDI_DIMENSIONS)])
        g_h = np.bincount(i, g, s) + np.bincount(j, g, s)
        grad = np.concatenate([g_pos.ravel() * scale, g_h * height])
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad ** 2
        mhat, vhat = m / (1 - beta1 ** step), v / (1 - beta2 ** step)
        step_size = np.concatenate([np.full(s * VIVALDI_DIMENSIONS, VIVALDI_RATE * scale),
                                    np.full(s, VIVALDI_RATE)])
        params = params - step_size * mhat / (np.sqrt(vhat) + 1e-12)
    pos = params[:s * VIVALDI_DIMENSIONS].reshape(s, VIVALDI_DIMENSIONS)
    return pos, np.exp(params[s * VIVALDI_DIMENSIONS:]), seen


def vivaldi_point(graph: SiteGraph, seed: int) -> LogMatrices:
    """RTT from the Vivaldi coordinates; log throughput a line in the log predicted RTT. Pairs
    with a site no RTT reached are NaN (the global median stands in)."""
    pos, height, seen = vivaldi_coordinates(graph, seed)
    diff = pos[:, None, :] - pos[None, :, :]
    pred = np.sqrt((diff ** 2).sum(axis=2)) + height[:, None] + height[None, :]
    log_rtt = np.log(np.maximum(pred, 1e-3))
    log_rtt[~(seen[:, None] & seen[None, :])] = np.nan
    x = log_rtt[graph.i, graph.j]
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(graph.gbps > 0, np.log(graph.gbps), np.nan)
    line = _fit_line(x, y)
    log_bw = np.full(log_rtt.shape, np.nan) if line is None else line[0] + line[1] * log_rtt
    return log_rtt, log_bw


def VivaldiModel() -> PointControl:
    """Vivaldi network coordinates on measured RTTs; throughput regressed on predicted RTT."""
    return PointControl("vivaldi", vivaldi_point)
