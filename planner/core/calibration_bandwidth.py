"""The calibrated model's bandwidth for pairs with no measured throughput (docs/COSTMODEL.md
section 8), and the Factor record and robust statistics the rest of the calibration shares.

A link class's pairs are assumed to follow ``log bw = a_c + e * log bw(rtt)``: ``bw(rtt)`` the
TCP-window formula's figure (planner.core.fleet.bandwidth_from_rtt, 80 Gbit/s*ms / RTT up to its
10 Gbit/s cap), ``a_c`` one figure per class and ``e`` one exponent for every class of the fleet,
both fitted on the fleet's own throughput tests. ``e`` = 1 is the formula's RTT dependence (a
factor on the formula), 0 none (egress caps alone: a constant per class). How throughput falls
with RTT differs between clouds and on-premises links, so the shape is fitted per fleet, and
only on enough evidence: with fewer than MIN_EXPONENT_PAIRS pairs, or RTTs within a class
spanning less than MIN_EXPONENT_SPAN, ``e`` is 0 and each class gets its median.
Pure: values in, values out (numpy and scipy only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.core.fleet import GBIT, Network, Node, bandwidth_from_rtt

MAD_SCALE = 1.4826        # a normal distribution's sigma per median absolute deviation
OUTLIER_MADS = 3.0
# Floor of the residual spread (log units) when flagging outliers: a fit that explains every run
# almost exactly has a near-zero MAD, and a run 5% off it is noise, not an outlier.
MIN_SPREAD = 0.05
SOFT_L1_SCALE = 0.1       # residuals (log units) past ~10% weigh less than squares
# The exponent needs pairs at clearly different RTTs within a class: with fewer, or RTTs
# spanning less than this ratio, noise would set the slope.
MIN_EXPONENT_PAIRS = 8
MIN_EXPONENT_SPAN = 3.0
INTRA_SITE, INTER_SITE = "intra-site", "inter-site"


@dataclass(frozen=True)
class Factor:
    """A fitted number, its 16th-84th percentile interval and the runs behind it; ``fitted``
    False: too little evidence, the prior is kept."""

    value: float
    low: float
    high: float
    runs: int
    fitted: bool

    @classmethod
    def prior(cls, value: float, runs: int = 0) -> "Factor":
        return cls(value, value, value, runs, False)


@dataclass(frozen=True)
class BandwidthObservation:
    """A measured throughput between two sites and the formula's figure for their RTT (both
    Gbit/s)."""

    link_class: str
    formula_gbps: float
    measured_gbps: float


@dataclass(frozen=True)
class BandwidthFit:
    """What :func:`fit_bandwidth` found: per link class its figure ``a_c`` (Gbit/s where the
    formula says 1 Gbit/s, i.e. at 80 ms), and the fleet's exponent ``e``."""

    classes: dict[str, Factor] = field(default_factory=dict)
    exponent: Factor = Factor.prior(0.0)


def site_class(a: str | None, b: str | None) -> str:
    """The link class between sites ``a`` and ``b``: "intra-site", the provider pair ("aws>gcp")
    when both are "provider:region", else "inter-site"."""
    if a is not None and a == b:
        return INTRA_SITE
    if a and b and ":" in a and ":" in b:
        return f"{a.split(':', 1)[0]}>{b.split(':', 1)[0]}"
    return INTER_SITE


def link_class(a: Node, b: Node) -> str:
    return site_class(a.site_key, b.site_key)


def outliers(residuals: np.ndarray) -> np.ndarray:
    """Which residuals lie over OUTLIER_MADS scaled MADs from their median (none below 4
    values: too few to say which is off)."""
    if residuals.size < 4:
        return np.zeros(residuals.size, dtype=bool)
    centre = float(np.median(residuals))
    spread = max(MAD_SCALE * float(np.median(np.abs(residuals - centre))), MIN_SPREAD)
    return np.abs(residuals - centre) > OUTLIER_MADS * spread


def interval(samples: Sequence[float], value: float) -> tuple[float, float]:
    """The 16th and 84th percentiles of ``samples``, widened to hold ``value``."""
    if len(samples) == 0:
        return value, value
    low, high = np.percentile(samples, [16.0, 84.0])
    return min(float(low), value), max(float(high), value)


def _formula_rows(rtt: np.ndarray, bw: np.ndarray) -> np.ndarray:
    """Which pairs of these rows have the TCP-window formula of their RTT as bandwidth, i.e.
    no measured one: the Network keeps no flag for it, and completion gives unmeasured pairs
    exactly that figure (float32 rounding aside)."""
    rtt = np.asarray(rtt, dtype=float)
    finite = np.isfinite(rtt)
    formula = np.where(finite, bandwidth_from_rtt(np.where(finite, rtt, 1.0)), 0.0)
    return finite & np.isclose(np.asarray(bw, dtype=float), formula, rtol=1e-5, atol=0.0)


def class_gbps(value: Any, formula_gbps: Any, exponent: float) -> Any:
    """What a fitted class's figure ``value`` assumes for pairs whose formula figure is
    ``formula_gbps`` (Gbit/s, numbers or arrays): ``value * formula_gbps ** exponent``."""
    return value * np.power(formula_gbps, exponent)


def classed_bandwidth(net: Network, bandwidth: Mapping[str, Factor],
                      exponent: float = 0.0) -> np.ndarray:
    """``net.bw`` with every unmeasured pair of a fitted link class set by :func:`class_gbps`;
    pairs of unfitted classes keep the formula."""
    bw = np.array(net.bw, copy=True)
    if not any(f.fitted for f in bandwidth.values()):
        return bw
    sites: dict[str | None, int] = {}
    code = np.array([sites.setdefault(n.site_key, len(sites)) for n in net.nodes], dtype=np.int64)
    names = list(sites)

    def figure(a: str | None, b: str | None) -> float:
        f = bandwidth.get(site_class(a, b))
        return float(f.value) if f is not None and f.fitted else math.nan

    fig = np.array([[figure(a, b) for b in names] for a in names])
    n = net.n
    rows = max(1, (32 << 20) // max(1, 8 * n))   # row blocks: no n x n float64 temporaries
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        assumed = fig[code[lo:hi]][:, code]
        mask = _formula_rows(net.rtt_ms[lo:hi], bw[lo:hi]) & np.isfinite(assumed)
        mask[np.arange(hi - lo), np.arange(lo, hi)] = False     # the diagonal: the node itself
        block = bw[lo:hi]
        block[mask] = (class_gbps(assumed[mask], block[mask] / GBIT, exponent)
                       * GBIT).astype(bw.dtype)
    return bw


# ----------------------------------------------------------------------------------- fitting

def _slope_evidence(xs: Sequence[np.ndarray]) -> tuple[int, bool]:
    """(pairs in classes of two or more, whether they suffice to fit the exponent)."""
    pairs = sum(x.size for x in xs if x.size >= 2)
    span = max((float(x.max() - x.min()) for x in xs if x.size >= 2), default=0.0)
    return pairs, pairs >= MIN_EXPONENT_PAIRS and span >= math.log(MIN_EXPONENT_SPAN)


def _fit_exponent(ys: Sequence[np.ndarray], xs: Sequence[np.ndarray]) -> tuple[float, np.ndarray]:
    """The shared exponent in [0, 1] and the soft-L1 weights at it, from classes of two or more
    pairs: robust least squares of ``y = a_c + e x`` (log measured on log formula)."""
    from scipy.optimize import least_squares

    groups = [(y, x) for y, x in zip(ys, xs) if x.size >= 2]
    y = np.concatenate([g[0] for g in groups])
    x = np.concatenate([g[1] for g in groups])
    member = np.concatenate([np.full(g[0].size, k) for k, g in enumerate(groups)])
    jac = np.zeros((y.size, 1 + len(groups)))
    jac[:, 0] = -x
    jac[np.arange(y.size), 1 + member] = -1.0

    def residuals(p: np.ndarray) -> np.ndarray:
        return y - p[1:][member] - p[0] * x

    x0 = np.concatenate([[0.5], [float(np.median(g[0] - 0.5 * g[1])) for g in groups]])
    low = np.concatenate([[0.0], np.full(len(groups), -np.inf)])
    high = np.concatenate([[1.0], np.full(len(groups), np.inf)])
    result = least_squares(residuals, x0, jac=lambda p: jac, bounds=(low, high),
                           loss="soft_l1", f_scale=SOFT_L1_SCALE, method="trf")
    r = residuals(result.x)
    return float(result.x[0]), (1.0 + (r / SOFT_L1_SCALE) ** 2) ** -0.5


def _weighted_slopes(ys: Sequence[np.ndarray], xs: Sequence[np.ndarray],
                     ws: Sequence[np.ndarray], draws: Sequence[np.ndarray]) -> np.ndarray:
    """Per resample (rows of each class's ``draws``), the weighted within-class slope of y on x,
    clipped to [0, 1]: the soft-L1 fit's step from its own weights, which is exact for a
    linear model at those weights."""
    sxy = sxx = 0.0
    for y, x, w, d in zip(ys, xs, ws, draws):
        yd, xd, wd = y[d], x[d], w[d]
        total = wd.sum(axis=1)
        mx, my = (wd * xd).sum(axis=1) / total, (wd * yd).sum(axis=1) / total
        sxy = sxy + (wd * xd * yd).sum(axis=1) - total * mx * my
        sxx = sxx + (wd * xd * xd).sum(axis=1) - total * mx * mx
    sxx = np.asarray(sxx, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(sxx > 0, np.asarray(sxy) / np.where(sxx > 0, sxx, 1.0), 0.0)
    return np.clip(slope, 0.0, 1.0)


def fit_bandwidth(obs: Sequence[BandwidthObservation], *, min_runs: int = 3,
                  seed: int = 0, resamples: int = 200) -> BandwidthFit:
    """The fleet's exponent ``e`` and, per link class, its figure ``a_c`` for
    :func:`class_gbps` (see the module's docstring). ``e``: soft-L1 least squares of log
    measured on log formula with one intercept per class, bounded to [0, 1], fitted only on
    MIN_EXPONENT_PAIRS pairs spanning MIN_EXPONENT_SPAN in RTT within a class, else 0 (fitted
    False). ``a_c``: the median of measured / formula ** e over the class's pairs, pairs more
    than 3 scaled MADs off that line left out (and ``e`` refitted without them). Intervals: a
    seeded bootstrap resampling each class's pairs. A class with fewer than ``min_runs``
    usable pairs keeps the formula: ``Factor.prior(1.0)``, fitted False, its value no figure."""
    by_class: dict[str, list[tuple[float, float]]] = {}
    for o in obs:
        if o.formula_gbps > 0 and o.measured_gbps > 0 and math.isfinite(o.formula_gbps) \
                and math.isfinite(o.measured_gbps):
            by_class.setdefault(o.link_class, []).append(
                (math.log(o.measured_gbps), math.log(o.formula_gbps)))
    names = sorted(by_class)
    ys = [np.array([p[0] for p in by_class[c]]) for c in names]
    xs = [np.array([p[1] for p in by_class[c]]) for c in names]
    e, fitted_e = 0.0, _slope_evidence(xs)[1]
    if fitted_e:
        e = _fit_exponent(ys, xs)[0]
    keep = [~outliers(y - e * x) for y, x in zip(ys, xs)]
    ys, xs = [y[k] for y, k in zip(ys, keep)], [x[k] for x, k in zip(xs, keep)]
    runs, fitted_e = _slope_evidence(xs)
    weights = [np.ones(y.size) for y in ys]
    if fitted_e:
        e, w = _fit_exponent(ys, xs)
        parts = np.cumsum([0] + [y.size for y in ys if y.size >= 2])
        big = [k for k, y in enumerate(ys) if y.size >= 2]
        for n, k in enumerate(big):
            weights[k] = w[parts[n]:parts[n + 1]]
    else:
        e = 0.0
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, max(1, y.size), size=(resamples, y.size)) for y in ys]
    boot_e = (_weighted_slopes(ys, xs, weights, draws) if fitted_e
              else np.zeros(resamples))
    classes: dict[str, Factor] = {}
    for name, y, x, d in zip(names, ys, xs, draws):
        if y.size < min_runs:
            classes[name] = Factor.prior(1.0, int(y.size))
            continue
        value = math.exp(float(np.median(y - e * x)))
        boot = np.exp(np.median(y[d] - boot_e[:, None] * x[d], axis=1))
        classes[name] = Factor(value, *interval(boot.tolist(), value), runs=int(y.size),
                               fitted=True)
    exponent = (Factor(e, *interval(boot_e.tolist(), e), runs=runs, fitted=True) if fitted_e
                else Factor.prior(0.0, runs))
    return BandwidthFit(classes, exponent)
