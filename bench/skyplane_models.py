"""The bandwidth a calibration could assume for region pairs with no measured throughput, judged
on held-out Skyplane pairs (bench/skyplane_bench.py runs and reports it).

Every model is fitted per link class (the provider pair, planner.core.calibration.link_class) on a
seeded random share of the pairs and judged on the others; a class with fewer than ``MIN_RUNS``
measured pairs keeps the RTT formula in every model:

- ``factor``: the formula times the class's median measured/formula ratio (ratios more than 3
  scaled MADs off left out), the calibration's model before this comparison;
- ``median``: the class's median measured Gbit/s, whatever the RTT;
- ``lower quartile``: the class's 25th percentile, whatever the RTT;
- ``conservative``: the 16th percentile of a seeded bootstrap of the class's median: the median
  once many pairs agree, below it while few do;
- ``power law``: the class's median of measured / formula ** e, times formula ** e, with e the
  least-squares log-log slope of measured on formula within the classes, fitted on the
  measured pairs;
- ``tuned``: the class's median of measured / shape, times shape, with the shape
  min(1, 80 ms / RTT) ** 0.3: exponent and knee read off this very data set, so its held-out
  figures are in-sample (a comparison, no model the planner uses);
- ``calibrated``: what planner.core.calibration.fit_bandwidth gives, the planner's model: the
  power law fitted robustly (soft-L1, outliers out) with one exponent for all classes, and only
  on enough evidence (else the class median).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.skyplane_data import Pair, formula_gbps, grouped, stats

MIN_RUNS = 3
MODELS = ("factor", "median", "lower quartile", "conservative", "power law", "tuned",
          "calibrated")
# The tuned comparison's constants: the log-log slope within provider pairs and the RTT below
# which throughput stops rising, both read off this benchmark's own data.
TUNED_EXPONENT = 0.3
TUNED_KNEE_RTT_MS = 80.0
FRACTIONS = (0.01, 0.02, 0.05, 0.10, 0.25, 0.50)
DRAWS = 5                       # seeded draws of the measured pairs per fraction
GPU = ("A100", 8, 8.0, 40.0)    # name, GPUs per server, compute capability, GB per GPU


@dataclass(frozen=True)
class CalibrationApi:
    """What the calibrated model calls: planner.core.calibration's fit_bandwidth (giving the
    class figures ``classes`` and the ``exponent``), link_class and BandwidthObservation
    (bench.skyplane_bench.calibration_api), or stand-ins built from the same records; and its
    Calibration, which the plan case applies to the network."""

    fit_bandwidth: Callable
    link_class: Callable
    observation: Callable
    calibration: Callable | None = None     # Calibration(bandwidth=...), for the plan case


@dataclass(frozen=True)
class Figures:
    """What a model assumes per link class: its figure times the formula's Gbit/s for the
    pair's RTT to the power ``exponent`` (1: a factor on the formula; 0: a constant), with a
    finite ``knee_gbps`` as a share of the knee and no higher than it; a class not in
    ``by_class`` keeps the formula."""

    by_class: Mapping[str, float]
    exponent: float = 0.0
    knee_gbps: float = math.inf

    def shape(self, formula: Any) -> Any:
        if math.isinf(self.knee_gbps):
            return np.power(formula, self.exponent)
        return np.power(np.minimum(formula, self.knee_gbps) / self.knee_gbps, self.exponent)

    def gbps(self, cls: str, rtt_ms: float) -> float:
        value = self.by_class.get(cls)
        formula = formula_gbps(rtt_ms)
        return formula if value is None else float(value * self.shape(formula))


def region_node(region: str, serial: int = 0):
    from planner.core.fleet import Node

    name, gpus, cc, gb = GPU
    return Node(id=f"{region}/{serial}", gpus=gpus, gpu_name=name, compute_capability=cc,
                memory_gb=gpus * gb, site=region)


def pair_class(api: CalibrationApi, src: str, dst: str) -> str:
    return api.link_class(region_node(src), region_node(dst))


def fit_calibrated(api: CalibrationApi, measured: Sequence[Pair]) -> Any:
    """The planner's fit_bandwidth on ``measured`` pairs: class figures and exponent."""
    return api.fit_bandwidth([
        api.observation(link_class=pair_class(api, p.src, p.dst),
                        formula_gbps=formula_gbps(p.rtt_ms), measured_gbps=p.measured_gbps)
        for p in measured])


def fit_model(model: str, api: CalibrationApi, measured: Sequence[Pair]) -> Figures:
    if model == "calibrated":
        fitted = fit_calibrated(api, measured)
        return Figures({c: float(f.value) for c, f in fitted.classes.items() if f.fitted},
                       float(fitted.exponent.value))
    by: dict[str, list[Pair]] = {}
    for p in measured:
        by.setdefault(pair_class(api, p.src, p.dst), []).append(p)
    by = {c: ps for c, ps in by.items() if len(ps) >= MIN_RUNS}
    if model == "factor":
        factors = {}
        for c, ps in by.items():
            logs = np.log([p.measured_gbps / formula_gbps(p.rtt_ms) for p in ps])
            kept = logs[~_outliers(logs)]
            if kept.size >= MIN_RUNS:
                factors[c] = float(np.exp(np.median(kept)))
        return Figures(factors, 1.0)
    if model == "tuned":
        tuned = Figures({}, TUNED_EXPONENT, formula_gbps(TUNED_KNEE_RTT_MS))
        figures = {}
        for c, ps in by.items():
            logs = np.log([p.measured_gbps / tuned.shape(formula_gbps(p.rtt_ms)) for p in ps])
            kept = logs[~_outliers(logs)]
            if kept.size >= MIN_RUNS:
                figures[c] = float(np.exp(np.median(kept)))
        return Figures(figures, tuned.exponent, tuned.knee_gbps)
    if model == "conservative":
        rng = np.random.default_rng(0)
        out = {}
        for c, ps in by.items():
            logs = np.log([p.measured_gbps for p in ps])
            boot = np.median(logs[rng.integers(0, logs.size, size=(200, logs.size))], axis=1)
            out[c] = float(np.exp(min(np.percentile(boot, 16.0), np.median(logs))))
        return Figures(out)
    if model == "power law":
        logs = {c: (np.log([p.measured_gbps for p in ps]),
                    np.log([formula_gbps(p.rtt_ms) for p in ps])) for c, ps in by.items()}
        x = np.concatenate([f - f.mean() for _, f in logs.values()] or [np.zeros(0)])
        y = np.concatenate([m - m.mean() for m, _ in logs.values()] or [np.zeros(0)])
        e = float(np.clip((x @ y) / (x @ x), 0.0, 1.0)) if x.size and x @ x > 0 else 0.0
        return Figures({c: float(np.exp(np.median(m - e * f))) for c, (m, f) in logs.items()},
                       e)
    q = {"median": 50.0, "lower quartile": 25.0}[model]
    return Figures({c: float(np.percentile([p.measured_gbps for p in ps], q))
                    for c, ps in by.items()})


def _outliers(logs: np.ndarray) -> np.ndarray:
    """Over 3 scaled MADs (at least 0.05) from the median; none below 4 values."""
    if logs.size < 4:
        return np.zeros(logs.size, dtype=bool)
    centre = float(np.median(logs))
    spread = max(1.4826 * float(np.median(np.abs(logs - centre))), 0.05)
    return np.abs(logs - centre) > 3.0 * spread


class AppliedFigures:
    """A model's figures applied to a network for the plan case: every pair whose bandwidth is
    the formula of its RTT (none measured) gets its own direction's class's figure."""

    def __init__(self, figures: Figures, link_class: Callable):
        self.figures, self.link_class = figures, link_class

    def apply(self, net):
        from planner.core.fleet import GBIT, bandwidth_from_rtt

        rtt = np.asarray(net.rtt_ms, dtype=float)
        finite = np.isfinite(rtt)
        formula = np.where(finite, bandwidth_from_rtt(np.where(finite, rtt, 1.0)), 0.0)
        mask = finite & np.isclose(np.asarray(net.bw, float), formula, rtol=1e-5, atol=0.0)
        np.fill_diagonal(mask, False)
        value = np.array([[self.figures.by_class.get(self.link_class(a, b), np.nan)
                           for b in net.nodes] for a in net.nodes])
        mask &= np.isfinite(value)
        assumed = np.where(mask, value, 1.0) * self.figures.shape(formula / GBIT) * GBIT
        out = copy.copy(net)
        out.bw = np.where(mask, assumed, net.bw).astype(net.bw.dtype)
        return out


def measured_sample(pairs: Sequence[Pair], fraction: float, seed: int) -> set[int]:
    """Indices of a seeded random ``fraction`` of ``pairs`` (at least one)."""
    rng = random.Random(f"{seed}:{fraction}")
    return set(rng.sample(range(len(pairs)), max(1, round(fraction * len(pairs)))))


def held_out_case(pairs: Sequence[Pair], api: CalibrationApi, fractions=FRACTIONS,
                  draws: int = DRAWS, models: Sequence[str] = MODELS) -> dict:
    """Per fraction and model: the error on the pairs not measured, pooled over ``draws``
    seeded draws (all pairs and per provider pair), the share of pairs it overrates by more
    than 1.2x, the spread of the draws' medians, the first draw's calibrated figures and each
    draw's calibrated exponent."""
    out = {}
    for fraction in fractions:
        held: list[Pair] = []
        assumed: dict[str, list[float]] = {m: [] for m in models}
        medians: dict[str, list[float]] = {m: [] for m in models}
        first, exponents = None, []
        for seed in range(draws):
            chosen = sorted(measured_sample(pairs, fraction, seed))
            taken = set(chosen)
            measured = [pairs[k] for k in chosen]
            rest = [p for k, p in enumerate(pairs) if k not in taken]
            classes = [pair_class(api, p.src, p.dst) for p in rest]
            for m in models:
                figures = fit_model(m, api, measured)
                if m == "calibrated":
                    exponents.append(figures.exponent)
                    first = dict(figures.by_class) if first is None else first
                values = [figures.gbps(c, p.rtt_ms) for c, p in zip(classes, rest)]
                medians[m].append(stats(values, [p.measured_gbps for p in rest])
                                  ["median_abs_log"])
                assumed[m] += values
            held += rest
        truth = np.array([p.measured_gbps for p in held])
        out[f"{fraction:.0%}"] = {
            "fraction": fraction, "draws": draws,
            "measured_pairs": max(1, round(fraction * len(pairs))),
            "calibrated_gbps_first_draw": first,
            "calibrated_exponent_by_draw": exponents,
            "models": {m: {**grouped(held, assumed[m]),
                           "overrated_1.2x_share": float(np.mean(np.array(assumed[m]) / truth
                                                                 > 1.2)),
                           "draw_median_abs_log": [min(medians[m]), max(medians[m])]}
                       for m in models}}
    return out
