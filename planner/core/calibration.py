"""The calibrated cost model (docs/COSTMODEL.md section 8): a few interpretable factors fitted
to what the fleet measured.

The reference model (planner/core/costmodel.py) stays the one home of every formula; a
calibration only changes the numbers it reads, through :meth:`Calibration.apply`, which returns
a new Network:

- ``compute[gpu]`` multiplies the reference throughput g F 0.4 of every server with that GPU;
- ``bandwidth[class]``, when fitted, is a link class's figure in Gbit/s: a pair of the class
  with no measured bandwidth gets it times the formula's Gbit/s to the power
  ``bandwidth_exponent`` (:func:`class_gbps`), in place of the formula (a measured figure
  always wins, docs/COSTMODEL.md section 2); an unfitted class keeps the formula;
- ``communication`` divides every bandwidth: what training achieves against a throughput test;
- ``hop_overhead_s`` is added once to every pipeline hop (costmodel.transfer_s);
- ``micro_batch_overhead_s`` to every stage's compute of a micro-batch (stage_compute_s);
- ``step_overhead_s`` once to every replica's iteration (replica_step_s): the optimizer step
  and per-step work no micro-batch count scales;
- ``outer_sync`` multiplies a DiLoCo job's outer sync (costmodel_sync.outer_sync_s): what it
  takes against its price (both directions of the slow links at once, the compression's work,
  the islands' wait for one another).

:func:`fit_bandwidth` fits the class figures and the exponent from throughput tests
(planner/core/calibration_bandwidth.py);
:func:`fit` fits the rest from measured iteration times of placed jobs, robustly, in log space.
Pure: values in, values out (numpy and scipy only).
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hulk.errors import InputError
from hulk.wire.progress import MAX_STEP_S
from planner.core.calibration_bandwidth import (INTER_SITE, INTRA_SITE, SOFT_L1_SCALE,
                                                BandwidthFit, BandwidthObservation, Factor,
                                                class_gbps, classed_bandwidth, fit_bandwidth,
                                                link_class, site_class)
from planner.core.calibration_bandwidth import interval as _interval
from planner.core.calibration_bandwidth import outliers as _outliers
from planner.core.costmodel import Placement, Stage, estimate, median_is_inner, micro_batches
from planner.core.fleet import Network, Node
from planner.core.gpus import lookup_name

__all__ = ["FORMAT", "INTER_SITE", "INTRA_SITE", "BandwidthFit", "BandwidthObservation",
           "Calibration", "Factor", "Observation", "class_gbps", "classed_bandwidth", "fit",
           "fit_bandwidth", "gpu_key", "link_class", "site_class"]

FORMAT = "hulk-calibration/5"
# Formats read as they are; a /4 file has no outer-sync factor and a /3 file no step overhead
# either: each reads at its prior (1, 0 s).
READABLE_FORMATS = (FORMAT, "hulk-calibration/4", "hulk-calibration/3")
MAX_NAME_CHARS = 255        # a GPU, class or job name in a calibration file
MAX_RUNS = 2 ** 31 - 1
# Formats whose bandwidth factors multiplied the RTT formula: no Gbit/s figure follows from them.
OLD_FORMATS = ("hulk-calibration/1",)
LOG_BOUND = 5.0           # factors within exp(+-5): wider than any real GPU or link is off
# What a file may hold (docs/BOUNDS.md), wider than any fit gives: a multiplier (compute,
# communication, outer_sync) within 1e-3 to 1e3 (the fit stays within exp(+-5)); a class figure
# within 1e-6 to 1e6 Gbit/s; an overhead within 0 to MAX_STEP_S seconds (the fit's bound is the
# longest measured step). Past these a plan's arithmetic would overflow or underflow.
MULTIPLIER_RANGE = (1e-3, 1e3)
BANDWIDTH_GBPS_RANGE = (1e-6, 1e6)
OVERHEAD_S_RANGE = (0.0, MAX_STEP_S)
EXPONENT_RANGE = (0.0, 1.0)
MAX_OUTLIER_ROUNDS = 3
# A parameter counts as fitted only if a 5% step each way moves some run's estimate by 0.1%.
IDENTIFY_STEP, IDENTIFY_CHANGE = 0.05, 1e-3
# A parameter whose effect on the runs the others reproduce to 1% is not told apart from them.
SEPARABLE = 1e-2

@dataclass(frozen=True)
class Observation:
    """One placed job's measured iteration time on the network it ran on: wall seconds per step,
    outer syncs included, or with ``median_step`` the median over its steps, which a DiLoCo job's
    outer syncs (every H > 2 steps) do not reach (costmodel.Estimate.median_step_s)."""

    placement: Placement
    net: Network
    measured_iteration_s: float
    name: str
    median_step: bool = False



def gpu_key(node: Node) -> str:
    """The GPU model a compute factor belongs to: the catalog's name, else the node's GPU name,
    else its compute capability ("cc8.0"), else "unknown"."""
    row = lookup_name(node.gpu_name)
    if row is not None:
        return row[0]
    if node.gpu_name and node.gpu_name.strip():
        return node.gpu_name.strip()
    if node.compute_capability is not None:
        return f"cc{float(node.compute_capability):.1f}"
    return "unknown"


def _factor_value(factors: Mapping[str, Factor], key: str, default: float = 1.0) -> float:
    f = factors.get(key)
    return default if f is None else float(f.value)


def _applied(net: Network, thr_scale: np.ndarray, bw: np.ndarray, communication: float,
             hop_s: float, micro_batch_s: float, step_s: float = 0.0,
             outer: float = 1.0) -> Network:
    out = copy.copy(net)
    out.thr = net.thr * thr_scale
    out.bw = bw / communication if communication != 1.0 else bw
    out.hop_overhead_s, out.micro_batch_overhead_s = float(hop_s), float(micro_batch_s)
    out.step_overhead_s, out.outer_sync_factor = float(step_s), float(outer)
    return out


@dataclass(frozen=True)
class Calibration:
    """Fitted factors (see the module's docstring: ``bandwidth`` holds Gbit/s figures, the
    others multipliers or seconds) and the observations left out as outliers."""

    compute: Mapping[str, Factor] = field(default_factory=dict)
    bandwidth: Mapping[str, Factor] = field(default_factory=dict)
    hop_overhead_s: Factor = Factor.prior(0.0)
    micro_batch_overhead_s: Factor = Factor.prior(0.0)
    communication: Factor = Factor.prior(1.0)
    outliers: tuple[str, ...] = ()
    bandwidth_exponent: Factor = Factor.prior(0.0)    # the class figures' shape, in [0, 1]
    step_overhead_s: Factor = Factor.prior(0.0)
    outer_sync: Factor = Factor.prior(1.0)

    def apply(self, net: Network) -> Network:
        """A new Network with this calibration's factors; ``net`` is left as it is."""
        scale = np.array([_factor_value(self.compute, gpu_key(n)) for n in net.nodes], dtype=float)
        return _applied(net, scale, classed_bandwidth(net, self.bandwidth,
                                                  float(self.bandwidth_exponent.value)),
                        float(self.communication.value), float(self.hop_overhead_s.value),
                        float(self.micro_batch_overhead_s.value),
                        float(self.step_overhead_s.value), float(self.outer_sync.value))

    @property
    def identity(self) -> bool:
        """True when applying it changes no number (every factor at its prior)."""
        return (all(f.value == 1.0 for f in self.compute.values())
                and not any(f.fitted for f in self.bandwidth.values())
                and self.communication.value == self.outer_sync.value == 1.0
                and self.hop_overhead_s.value == self.micro_batch_overhead_s.value
                == self.step_overhead_s.value == 0.0)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT,
                "compute": {k: _factor_json(f) for k, f in sorted(self.compute.items())},
                "bandwidth": {k: _factor_json(f) for k, f in sorted(self.bandwidth.items())},
                "bandwidth_exponent": _factor_json(self.bandwidth_exponent),
                "hop_overhead_s": _factor_json(self.hop_overhead_s),
                "micro_batch_overhead_s": _factor_json(self.micro_batch_overhead_s),
                "step_overhead_s": _factor_json(self.step_overhead_s),
                "communication": _factor_json(self.communication),
                "outer_sync": _factor_json(self.outer_sync),
                "outliers": list(self.outliers)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "Calibration":
        """The calibration ``to_json`` wrote; InputError naming ``where`` and the field when not."""
        if not isinstance(data, dict):
            raise InputError(f"expected a JSON object ({FORMAT})", path=where)
        if data.get("format") in OLD_FORMATS:
            raise InputError(f"{data['format']} is an older format (its bandwidth factors "
                             f"multiplied the RTT formula; {FORMAT}'s are Gbit/s): write it "
                             "again with `hulk-planner calibrate --out`", path=where,
                             field="format")
        if data.get("format") not in READABLE_FORMATS:
            raise InputError(f"expected {FORMAT!r}, got {data.get('format')!r}", path=where,
                             field="format")
        groups = {}
        for group in ("compute", "bandwidth"):
            value = data.get(group, {})
            if not isinstance(value, dict):
                raise InputError("expected an object of factors", path=where, field=group)
            if any(len(k) > MAX_NAME_CHARS for k in value):
                raise InputError(f"expected names of at most {MAX_NAME_CHARS} characters",
                                 path=where, field=group)
            limits = MULTIPLIER_RANGE if group == "compute" else BANDWIDTH_GBPS_RANGE
            # A name that is not printable is quoted: the message stays one line.
            groups[group] = {str(k): _factor_from(
                v, where, f"{group}.{k if str(k).isprintable() else ascii(k)}", limits)
                             for k, v in value.items()}
        outliers = data.get("outliers", [])
        if not isinstance(outliers, list) or not all(
                isinstance(o, str) and len(o) <= MAX_NAME_CHARS for o in outliers):
            raise InputError(f"expected a list of names of at most {MAX_NAME_CHARS} characters",
                             path=where, field="outliers")
        # The micro-batch overhead may be absent, as a /3 file's step overhead is and a /3 or
        # /4 file's outer-sync factor: each then reads at its prior.
        zero, one = _factor_json(Factor.prior(0.0)), _factor_json(Factor.prior(1.0))
        older = data["format"] != FORMAT
        single = {name: _factor_from(data.get(name, default), where, name, limits)
                  for name, default, limits in (
                      ("hop_overhead_s", None, OVERHEAD_S_RANGE),
                      ("communication", None, MULTIPLIER_RANGE),
                      ("micro_batch_overhead_s", zero, OVERHEAD_S_RANGE),
                      ("step_overhead_s", zero if data["format"] == "hulk-calibration/3" else None,
                       OVERHEAD_S_RANGE),
                      ("outer_sync", one if older else None, MULTIPLIER_RANGE))}
        exponent = _factor_from(data.get("bandwidth_exponent"), where, "bandwidth_exponent",
                                EXPONENT_RANGE)
        return cls(compute=groups["compute"], bandwidth=groups["bandwidth"], **single,
                   outliers=tuple(outliers), bandwidth_exponent=exponent)


def _factor_json(f: Factor) -> dict[str, Any]:
    return {"value": f.value, "low": f.low, "high": f.high, "runs": f.runs, "fitted": f.fitted}


def _factor_from(value: Any, where: str, name: str, limits: tuple[float, float]) -> Factor:
    if not isinstance(value, dict):
        raise InputError("expected an object with value, low, high, runs, fitted", path=where,
                         field=name)
    numbers = {}
    least, most = limits
    for key in ("value", "low", "high"):
        x = value.get(key)
        if isinstance(x, bool) or not isinstance(x, (int, float)) \
                or not (isinstance(x, int) or math.isfinite(x)) or not least <= x <= most:
            raise InputError(f"expected a number from {least:g} to {most:g}, got "
                             f"{str(x)[:40]}", path=where, field=f"{name}.{key}")
        numbers[key] = float(x)
    if not numbers["low"] <= numbers["value"] <= numbers["high"]:
        raise InputError("expected low <= value <= high", path=where, field=name)
    runs, fitted = value.get("runs"), value.get("fitted")
    if isinstance(runs, bool) or not isinstance(runs, int) or not 0 <= runs <= MAX_RUNS:
        raise InputError(f"expected a whole number of runs from 0 to {MAX_RUNS:,}, got "
                         f"{str(runs)[:40]}", path=where, field=f"{name}.runs")
    if not isinstance(fitted, bool):
        raise InputError(f"expected true or false, got {fitted!r}", path=where,
                         field=f"{name}.fitted")
    return Factor(numbers["value"], numbers["low"], numbers["high"], runs, fitted)


# ----------------------------------------------------------------------------------- fitting

@dataclass
class _Prepared:
    """An observation on the sub-network of its own nodes, with what each evaluation needs."""

    name: str
    placement: Placement
    net: Network
    bw: np.ndarray            # the class-scaled bandwidth
    keys: list[str]           # GPU key per node
    log_measured: float
    hops: bool                # has pipeline hops
    communicates: bool        # has hops or an all-reduce
    slots: int                # K + M - 1: micro-batch computations on the pipeline's path
    samples: int              # M b: samples each replica computes per iteration
    outer: bool               # measured with outer syncs among two or more islands
    median_step: bool         # the measurement is a median step (Observation.median_step)


def _prepare(o: Observation, bandwidth: Mapping[str, Factor], exponent: float) -> _Prepared:
    nodes = o.placement.nodes
    net = o.net.subset(nodes)
    back = {old: new for new, old in enumerate(nodes)}
    stages = tuple(Stage(st.lo, st.hi, tuple(back[i] for i in st.nodes))
                   for st in o.placement.stages)
    placement = replace(o.placement, stages=stages)
    k, d = placement.num_stages, placement.replicas
    m = micro_batches(placement.job, d, placement.micro_batch)
    islands = len(placement.island_columns()) if placement.outer is not None else 1
    outer = islands > 1 and not (o.median_step and median_is_inner(placement.outer.inner_steps))
    return _Prepared(o.name, placement, net, classed_bandwidth(net, bandwidth, exponent),
                     [gpu_key(n) for n in net.nodes], math.log(o.measured_iteration_s),
                     k > 1, k > 1 or d > 1,
                     k + m - 1, m * placement.micro_batch, outer, o.median_step)


class _Model:
    """Parameters of one fit: log compute factors of ``gpus``, then, each when asked for, the
    hop, micro-batch and step overheads (seconds, at ``seconds``), the log communication factor
    and the log outer-sync factor."""

    def __init__(self, gpus: list[str], hop: bool, micro_batch: bool, comm: bool,
                 step: bool = False, outer: bool = False):
        self.gpus, self.hop, self.micro_batch, self.comm = gpus, hop, micro_batch, comm
        self.step, self.outer = step, outer
        n_seconds = int(hop) + int(micro_batch) + int(step)
        self.size = len(gpus) + n_seconds + int(comm) + int(outer)
        self.seconds = list(range(len(gpus), len(gpus) + n_seconds))

    def unpack(self, x: np.ndarray) -> tuple[dict[str, float], float, float, float, float, float]:
        """(compute factors, hop s, micro-batch s, communication factor, step s, outer factor)."""
        compute = {g: math.exp(float(v)) for g, v in zip(self.gpus, x)}
        rest = iter(x[len(self.gpus):])
        hop = float(next(rest)) if self.hop else 0.0
        micro_batch = float(next(rest)) if self.micro_batch else 0.0
        step = float(next(rest)) if self.step else 0.0
        comm = math.exp(float(next(rest))) if self.comm else 1.0
        outer = math.exp(float(next(rest))) if self.outer else 1.0
        return compute, hop, micro_batch, comm, step, outer

    def residuals(self, x: np.ndarray, obs: Sequence[_Prepared]) -> np.ndarray:
        compute, hop, micro_batch, comm, step, outer = self.unpack(x)
        out = np.empty(len(obs))
        for i, o in enumerate(obs):
            scale = np.array([compute.get(k, 1.0) for k in o.keys])
            net = _applied(o.net, scale, o.bw, comm, hop, micro_batch, step, outer)
            priced = estimate(o.placement, net)
            est = priced.median_step_s if o.median_step else priced.iteration_s
            out[i] = math.log(est) - o.log_measured if 0 < est < math.inf else 10.0
        return out

    def bounds(self, hop_max: float) -> tuple[np.ndarray, np.ndarray]:
        low, high = np.full(self.size, -LOG_BOUND), np.full(self.size, LOG_BOUND)
        low[self.seconds], high[self.seconds] = 0.0, hop_max
        return low, high


def _evidence(obs: Sequence[_Prepared]) -> tuple[dict[str, int], int, int, int, int]:
    """Runs touching each GPU model; with hops; with K + M > 2; that communicate; that
    measured outer syncs."""
    return (dict(Counter(k for o in obs for k in set(o.keys))), sum(o.hops for o in obs),
            sum(o.slots > 1 for o in obs), sum(o.communicates for o in obs),
            sum(o.outer for o in obs))


def _solve(model: _Model, obs: Sequence[_Prepared], x0: np.ndarray, hop_max: float) -> np.ndarray:
    from scipy.optimize import least_squares

    if model.size == 0 or not obs:
        return x0
    low, high = model.bounds(hop_max)
    x0 = np.clip(x0, low, high)
    # Overheads off their bound: trf starting on a bound barely moves (it shrinks steps there).
    x0[model.seconds] = np.maximum(x0[model.seconds], 1e-3 * hop_max)
    result = least_squares(model.residuals, x0, args=(obs,), bounds=(low, high), loss="soft_l1",
                           f_scale=SOFT_L1_SCALE, x_scale="jac", method="trf")
    return result.x


def _moved(model: _Model, obs: Sequence[_Prepared], x: np.ndarray, j: int,
           value: float) -> np.ndarray:
    """The residuals with parameter ``j`` of ``x`` set to ``value``."""
    xj = x.copy()
    xj[j] = value
    return model.residuals(xj, obs)


def _bootstrap(model: _Model, obs: Sequence[_Prepared], x: np.ndarray, hop_max: float,
               rng: np.random.Generator, resamples: int) -> list[np.ndarray]:
    """Parameter vectors refitted on seeded resamples of ``obs``, each by one Gauss-Newton step
    from ``x`` weighted as soft-L1 weighs there: a full robust fit per resample costs ~50
    estimates per observation, and the step moves the same way this close to the data."""
    if not model.size or len(obs) < 2:
        return []
    r = model.residuals(x, obs)
    low, high = model.bounds(hop_max)
    steps = np.full(model.size, 1e-6)
    steps[model.seconds] = 1e-6 * hop_max     # seconds, not log units
    jac = np.empty((len(obs), model.size))
    for j in range(model.size):
        v = x[j] + steps[j] if x[j] + steps[j] <= high[j] else x[j] - steps[j]
        jac[:, j] = (_moved(model, obs, x, j, v) - r) / (v - x[j])
    weight = np.sqrt((1.0 + (r / SOFT_L1_SCALE) ** 2) ** -0.5)
    out = []
    for _ in range(resamples):
        rows = rng.integers(0, len(obs), size=len(obs))
        a, b = jac[rows] * weight[rows, None], -r[rows] * weight[rows]
        step = np.linalg.lstsq(a, b, rcond=None)[0]
        out.append(np.clip(x + step, low, high))
    return out


def _identified(model: _Model, obs: Sequence[_Prepared], x: np.ndarray,
                hop_max: float) -> np.ndarray:
    """Per parameter, whether the runs pin it down: a step of IDENTIFY_STEP (log units; for
    overheads that share of the longest run) each way it can move changes some run's estimate.
    A GPU model never on a run's critical path sits on a plateau (any faster figure explains
    the runs as well); the optimizer drifts to the bound there, and a planner would trust it."""
    r = model.residuals(x, obs)
    low, high = model.bounds(hop_max)
    steps = np.full(model.size, IDENTIFY_STEP)
    steps[model.seconds] = IDENTIFY_STEP * hop_max
    out = np.zeros(model.size, dtype=bool)
    for j in range(model.size):
        moves = [x[j] + s for s in (-steps[j], steps[j]) if low[j] <= x[j] + s <= high[j]]
        changed = []
        for v in moves:
            changed.append(float(np.abs(_moved(model, obs, x, j, v) - r).max()) > IDENTIFY_CHANGE)
        out[j] = bool(moves) and all(changed)
    return out


def _separable(model: _Model, obs: Sequence[_Prepared], hop_max: float, j: int) -> bool:
    """Whether parameter ``j``'s effect on the runs differs from every mix of the others' at
    the fit's starting point: a step overhead beside runs that all spend the same seconds in
    their all-reduce moves every run as the communication factor does, and the fit could trade
    one for the other."""
    low, high = model.bounds(hop_max)
    x = np.clip(np.zeros(model.size), low, high)
    x[model.seconds] = 1e-3 * hop_max
    r = model.residuals(x, obs)
    steps = np.full(model.size, 1e-6)
    steps[model.seconds] = 1e-6 * hop_max
    jac = np.stack([(_moved(model, obs, x, i, x[i] + steps[i]) - r) / steps[i]
                    for i in range(model.size)], axis=1)
    column, others = jac[:, j], np.delete(jac, j, axis=1)
    if others.shape[1]:
        column = column - others @ np.linalg.lstsq(others, column, rcond=None)[0]
    return float(np.linalg.norm(column)) > SEPARABLE * float(np.linalg.norm(jac[:, j]))


def fit(observations: Sequence[Observation], *, bandwidth: Mapping[str, Factor] = {},
        bandwidth_exponent: Factor = Factor.prior(0.0), min_runs: int = 3, seed: int = 0,
        resamples: int = 200, communication: bool = True,
        min_outer_runs: int | None = None) -> Calibration:
    """Compute factors per GPU model, the hop, micro-batch and step overheads and the
    communication factor making estimate(placement, cal.apply(net)) match the measured iteration
    times (robust least squares in log space; ``bandwidth`` and its exponent, fitted by
    :func:`fit_bandwidth`, held fixed; ``communication`` False holds that factor at 1 too, for
    runs whose links throughput tests just measured). Runs with no positive finite
    measurement or estimate, or a residual past 3 scaled MADs, are named in ``outliers``; a
    factor fewer than ``min_runs`` kept runs touch keeps its prior (the outer-sync factor: fewer
    than ``min_outer_runs`` runs that measured outer syncs, default ``min_runs``); intervals:
    seeded bootstrap."""
    min_outer = min_runs if min_outer_runs is None else min_outer_runs
    bandwidth = dict(bandwidth)
    outliers: list[str] = []
    kept: list[_Prepared] = []
    for o in observations:
        ok = math.isfinite(o.measured_iteration_s) and o.measured_iteration_s > 0
        p = _prepare(o, bandwidth, float(bandwidth_exponent.value)) if ok else None
        if p is None or not math.isfinite(estimate(p.placement, p.net).iteration_s):
            outliers.append(o.name)
        else:
            kept.append(p)
    # No hop costs more than the longest measured iteration.
    hop_max = max((math.exp(o.log_measured) for o in kept), default=1.0)

    def model_for(obs: Sequence[_Prepared]) -> _Model:
        gpus, hops, micro, comms, outers = _evidence(obs)
        # Only runs of different K + M - 1 for the same work per replica (M b samples) tell a
        # per-micro-batch cost from slower compute; only runs of different work, a per-iteration
        # one.
        slots_by_work: dict[int, set[int]] = {}
        for o in obs:
            slots_by_work.setdefault(o.samples, set()).add(o.slots)
        varied = any(len(slots) > 1 for slots in slots_by_work.values())
        worked = len(slots_by_work) > 1
        model = _Model(sorted(g for g, n in gpus.items() if n >= min_runs), hops >= min_runs,
                       micro >= min_runs and varied, communication and comms >= min_runs,
                       step=len(obs) >= min_runs and worked, outer=outers >= min_outer)
        if model.step and not _separable(model, obs, hop_max, model.seconds[-1]):
            model = _Model(model.gpus, model.hop, model.micro_batch, model.comm,
                           outer=model.outer)
        return model

    model = model_for(kept)
    x = _solve(model, kept, np.zeros(model.size), hop_max)
    for _ in range(MAX_OUTLIER_ROUNDS):
        off = _outliers(model.residuals(x, kept))
        if not off.any():
            break
        outliers += [o.name for o, bad in zip(kept, off) if bad]
        kept = [o for o, bad in zip(kept, off) if not bad]
        model = model_for(kept)
        x = _solve(model, kept, np.zeros(model.size), hop_max)

    boot = _bootstrap(model, kept, x, hop_max, np.random.default_rng(seed), resamples)
    return _calibration(model, x, boot, kept, bandwidth, bandwidth_exponent, outliers,
                        _identified(model, kept, x, hop_max) if model.size else np.zeros(0, bool))


def _calibration(model: _Model, x: np.ndarray, boot: list[np.ndarray], kept: list[_Prepared],
                 bandwidth: dict[str, Factor], exponent: Factor,
                 outliers: list[str], identified: np.ndarray) -> Calibration:
    gpus, hops, micro, comms, outers = _evidence(kept)
    compute, hop, micro_batch, comm, step, outer = model.unpack(x)
    draws = [model.unpack(b) for b in boot]
    # Parameter order: model.gpus, then hop, micro-batch, step, communication and outer where
    # fitted.
    pinned = dict(zip([*model.gpus, *(["hop"] if model.hop else []),
                       *(["micro"] if model.micro_batch else []),
                       *(["step"] if model.step else []),
                       *(["comm"] if model.comm else []),
                       *(["outer"] if model.outer else [])], identified.tolist()))

    def one(on: bool, value: float, samples: list[float], runs: int, prior: float) -> Factor:
        return (Factor(value, *_interval(samples, value), runs=runs, fitted=True) if on
                else Factor.prior(prior, runs))

    out_compute = {g: one(pinned.get(g, False), compute.get(g, 1.0),
                          [d[0][g] for d in draws if g in d[0]], n, 1.0)
                   for g, n in sorted(gpus.items())}
    return Calibration(compute=out_compute, bandwidth=bandwidth,
                       hop_overhead_s=one(pinned.get("hop", False), hop,
                                          [d[1] for d in draws], hops, 0.0),
                       micro_batch_overhead_s=one(pinned.get("micro", False), micro_batch,
                                                  [d[2] for d in draws], micro, 0.0),
                       communication=one(pinned.get("comm", False), comm,
                                         [d[3] for d in draws], comms, 1.0),
                       outliers=tuple(outliers), bandwidth_exponent=exponent,
                       step_overhead_s=one(pinned.get("step", False), step,
                                           [d[4] for d in draws], len(kept), 0.0),
                       outer_sync=one(pinned.get("outer", False), outer,
                                      [d[5] for d in draws], outers, 1.0))
