"""What the store measured, as the calibration's observations (planner/core/calibration.py).

- Each job whose placement reported step times (``Store.job_iterations``) is an
  :class:`Observation`: its placement on the store's network and its slowest rank's median step
  (of a DiLoCo job syncing every H > 2 steps, an inner step: it says nothing of the outer sync).
  A DiLoCo job of two or more islands whose ranks timed two whole rounds or more by the wall
  clock (``JobIteration.wall_iteration_s`` over ``wall_steps >= 2 H``) is observed by that
  figure instead, wall seconds a step outer syncs included: it is what fits ``outer_sync``.
  The placement is the stages its job record kept (``jobs.stages_json``). Records placed before
  the store kept stages have only the nodes in stage-major order, the spec and the plan's
  estimate: for those the stages are rebuilt by trying each stage count that divides the nodes
  (layers balanced as the planners balance them, each micro-batch size the job could use) and
  keeping the one whose reference estimate is the plan's own estimate. A job whose placement
  cannot be had either way is left out and said why. Callers that hold the plan (a bench, a
  plan file) pass its placements instead.
- Each directed site pair with throughput tests (``Store.throughput_by_site_pair``) is a
  :class:`BandwidthObservation` of its link class: the tests' median Gbit/s with the
  TCP-window formula's figure for the pair's median RTT (the class's figure is fitted from
  both).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from hulk.errors import InputError
from planner.core.calibration import (BandwidthObservation, Calibration, Observation,
                                      fit, fit_bandwidth, site_class)
from planner.core.costmodel import Placement, estimate
from planner.core.fleet import GBIT, Network, bandwidth_from_rtt, complete
from planner.core.jobs import Job

if TYPE_CHECKING:
    from planner.service.job_progress import JobIteration
    from planner.service.store import Store

MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
# How close the rebuilt placement's reference estimate must come to the plan's own estimate.
MATCH_TOLERANCE = 0.02


@dataclass(frozen=True)
class CalibrationData:
    observations: list[Observation]
    bandwidth: list[BandwidthObservation]
    skipped: list[str] = field(default_factory=list)   # one line per job left out: why


def rebuild_placement(job: Job, node_ids: Sequence[str], net: Network,
                      estimated_iteration_s: float | None) -> Placement | None:
    """The placement of ``job`` on ``node_ids`` (stage-major) whose reference estimate is
    ``estimated_iteration_s`` (within MATCH_TOLERANCE); without an estimate, the only candidate
    if there is one. None when none fits."""
    from planner.search.arrangement import placement_from_grid

    if any(n not in net.index for n in node_ids) or not node_ids:
        return None
    order = np.array([net.index[n] for n in node_ids], dtype=np.int64)
    n = len(order)
    candidates: list[tuple[float, Placement]] = []
    for k in (k for k in range(1, min(n, job.layers) + 1) if n % k == 0):
        grid = order.reshape(k, n // k)
        for b in sorted({job.micro_batch, *MICRO_BATCHES}):
            if b > job.global_batch:
                continue
            p = placement_from_grid(job, net, grid, b)
            if p is None or len(p.nodes) != n:
                continue
            t = estimate(p, net).iteration_s
            if math.isfinite(t):
                candidates.append((t, p))
    if estimated_iteration_s is None or not estimated_iteration_s > 0:
        return candidates[0][1] if len(candidates) == 1 else None
    if not candidates:
        return None
    t, p = min(candidates, key=lambda c: abs(math.log(c[0] / estimated_iteration_s)))
    return p if abs(math.log(t / estimated_iteration_s)) <= MATCH_TOLERANCE else None


def observations(iterations: Sequence[JobIteration], net: Network, *,
                 placements: Mapping[str, Placement] | None = None
                 ) -> tuple[list[Observation], list[str]]:
    """(observations, why each job left out was left out) from the store's job iterations."""
    from planner.core.placements import job_from_spec, placement_from_stages

    out, skipped = [], []
    for it in iterations:
        name = f"{it.job_name}@{it.plan_id}"
        placement = (placements or {}).get(it.job_name)
        if placement is None:
            try:
                job = job_from_spec(it.job_name, it.spec)
            except Exception as exc:   # a spec the store kept from an older planner
                skipped.append(f"{name}: its spec does not read as a job ({exc})")
                continue
            missing = [n for n in it.nodes if n not in net.index]
            if missing:
                skipped.append(f"{name}: node {missing[0]} is no longer in the fleet")
                continue
            if it.stages is not None:
                try:
                    placement = placement_from_stages(job, it.stages, net)
                except InputError as exc:
                    skipped.append(f"{name}: its kept stages do not read as a placement ({exc})")
                    continue
            else:   # a record placed before the store kept stages: rebuilt (see the docstring)
                placement = rebuild_placement(job, it.nodes, net, it.estimated_iteration_s)
            if placement is None:
                skipped.append(f"{name}: its stages cannot be rebuilt from its nodes and the "
                               "plan's estimate")
                continue
        out.append(observation(placement, net, it, name))
    return out, skipped


def observation(placement: Placement, net: Network, it: JobIteration, name: str) -> Observation:
    """The job's wall seconds a step over whole rounds where it syncs islands and timed two
    rounds or more (a round's share of outer sync is then in it), else its median step (for a
    DiLoCo job syncing every H > 2 steps, the inner step: Observation's ``median_step``)."""
    outer = placement.outer
    if (outer is not None and len(placement.island_columns()) >= 2
            and it.wall_iteration_s > 0 and it.wall_steps >= 2 * outer.inner_steps):
        return Observation(placement, net, float(it.wall_iteration_s), name)
    return Observation(placement, net, float(it.measured_iteration_s), name, median_step=True)


def bandwidth_observations(throughput: Mapping[tuple[str, str], tuple[float, int]],
                           net: Network) -> list[BandwidthObservation]:
    """One observation per directed site pair with an ok test: its median Gbit/s and the
    formula's figure for the median RTT between the two sites' servers (a pair with no finite
    RTT between them is left out: the fit needs both)."""
    members: dict[str | None, list[int]] = {}
    for i, node in enumerate(net.nodes):
        members.setdefault(node.site_key, []).append(i)
    out = []
    for (a, b), (gbps, tests) in sorted(throughput.items()):
        src, dst = members.get(a), members.get(b)
        if not src or not dst or tests <= 0 or not gbps > 0:
            continue
        rtt = net.rtt_ms[np.ix_(src, dst)]
        rtt = rtt[np.isfinite(rtt) & (rtt > 0)] if a == b else rtt[np.isfinite(rtt)]
        if rtt.size == 0:
            continue
        formula = float(bandwidth_from_rtt(float(np.median(rtt)))) / GBIT
        out.append(BandwidthObservation(site_class(a, b), formula, float(gbps)))
    return out


def calibration_data(store: Store, *, net: Network | None = None, window_days: int = 90,
                     placements: Mapping[str, Placement] | None = None) -> CalibrationData:
    """The store's measurements as calibration observations on ``net`` (default: the store's
    completed network, measured throughput included)."""
    if net is None:
        from planner.service.graph import fleet_from_store

        net = complete(fleet_from_store(store, window_days))
    obs, skipped = observations(store.job_iterations(), net, placements=placements)
    return CalibrationData(obs, bandwidth_observations(
        store.throughput_by_site_pair(window_days), net), skipped)


def calibrate(data: CalibrationData, *, min_runs: int = 3, seed: int = 0) -> Calibration:
    """Bandwidth per link class (Gbit/s) and the fleet's exponent from the throughput tests,
    then the rest from the jobs' step times."""
    bandwidth = fit_bandwidth(data.bandwidth, min_runs=min_runs, seed=seed)
    return fit(data.observations, bandwidth=bandwidth.classes,
               bandwidth_exponent=bandwidth.exponent, min_runs=min_runs, seed=seed)


def has_evidence(cal: Calibration) -> bool:
    """True when some factor moved off its prior on enough evidence."""
    return any(f.fitted for f in (*cal.compute.values(), *cal.bandwidth.values(),
                                  cal.hop_overhead_s, cal.micro_batch_overhead_s,
                                  cal.step_overhead_s,
                                  cal.communication, cal.outer_sync))
