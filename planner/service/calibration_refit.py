"""serve's calibrated cost model: refitted from the store every ``--calibration-interval``
seconds and applied to every network serve plans on.

The refit (a background task) reads the store's measurements on the store's thread
(planner/service/calibration_data.py: the step times placed jobs reported, the throughput
tests), fits them off the event loop (the fit estimates every observation many times) and keeps
the result. Only fitted factors move: one with too little evidence stays at its prior, so a GPU
model no job has measured keeps the reference throughput. :meth:`ServeCalibration.apply` is the
network with that calibration (the reference network itself before the first fit);
``StoreDirectory.network`` applies it, so the job lifecycle and recovery plan, and store their
estimates (``jobs.estimate_s``, what ``jobs show`` compares measured steps with), on it.
Without the task (interval 0) serve plans with the reference model.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from hulk.plural import count
from planner.core.calibration import Calibration, Factor
from planner.core.fleet import Network
from planner.service.metrics import NO_EVENTS, ServeEvents
from planner.service.runtime import BackgroundTask
from planner.service.seams import InStore, ServeOptions
from planner.service.store import Store

log = logging.getLogger(__name__)


def fitted_only(cal: Calibration) -> Calibration:
    """``cal`` with every multiplier and overhead that was not fitted at its prior (1, 0 s); an
    unfitted link class's bandwidth figure is never applied anyway."""
    def kept(f: Factor, prior: float) -> Factor:
        return f if f.fitted else Factor.prior(prior, f.runs)

    return replace(cal, compute={k: kept(f, 1.0) for k, f in cal.compute.items()},
                   hop_overhead_s=kept(cal.hop_overhead_s, 0.0),
                   micro_batch_overhead_s=kept(cal.micro_batch_overhead_s, 0.0),
                   step_overhead_s=kept(cal.step_overhead_s, 0.0),
                   communication=kept(cal.communication, 1.0),
                   outer_sync=kept(cal.outer_sync, 1.0))


def factors(cal: Calibration) -> dict[str, float]:
    """The factors the ``hulk_calibration_factor`` gauge exports, by label: ``compute:<gpu>``,
    ``hop_overhead_s``, ``micro_batch_overhead_s``, ``step_overhead_s``, ``communication``,
    ``outer_sync``."""
    out = {f"compute:{k}": f.value for k, f in sorted(cal.compute.items())}
    out.update(hop_overhead_s=cal.hop_overhead_s.value,
               micro_batch_overhead_s=cal.micro_batch_overhead_s.value,
               step_overhead_s=cal.step_overhead_s.value,
               communication=cal.communication.value, outer_sync=cal.outer_sync.value)
    return out


def planned_with(cal: Calibration) -> dict[str, float]:
    """Every number the calibration changes plans with: the factors, each fitted link class's
    Gbit/s and the bandwidth exponent those figures fall with."""
    out = {**factors(cal), **{f"bandwidth:{k}": f.value for k, f in sorted(cal.bandwidth.items())
                              if f.fitted}}
    if cal.bandwidth_exponent.fitted:
        out["bandwidth_exponent"] = cal.bandwidth_exponent.value
    return out


def describe(cal: Calibration) -> str:
    """The fitted factors, one line."""
    shown = [f"compute {k} {f.value:.3g}x" for k, f in sorted(cal.compute.items()) if f.fitted]
    shown += [f"bandwidth {k} {f.value:.3g} Gbit/s" for k, f in sorted(cal.bandwidth.items())
              if f.fitted]
    if cal.bandwidth_exponent.fitted:
        shown.append(f"bandwidth exponent {cal.bandwidth_exponent.value:.2g}")
    if cal.hop_overhead_s.fitted:
        shown.append(f"hop overhead {cal.hop_overhead_s.value * 1000:.3g} ms")
    if cal.micro_batch_overhead_s.fitted:
        shown.append(f"micro-batch overhead {cal.micro_batch_overhead_s.value * 1000:.3g} ms")
    if cal.step_overhead_s.fitted:
        shown.append(f"step overhead {cal.step_overhead_s.value * 1000:.3g} ms")
    if cal.communication.fitted:
        shown.append(f"communication {cal.communication.value:.3g}x")
    if cal.outer_sync.fitted:
        shown.append(f"outer sync {cal.outer_sync.value:.3g}x")
    return ", ".join(shown) if shown else "no factor fitted yet (the reference model)"


class ServeCalibration:
    """The calibration serve plans with, refitted by :meth:`refit` from ``store`` (read through
    ``in_store``, the store's thread) over ``window_days``."""

    def __init__(self, store: Store, in_store: InStore, *, window_days: int = 90,
                 min_runs: int = 3, seed: int = 0, events: ServeEvents = NO_EVENTS):
        self.store, self.in_store = store, in_store
        self.window_days, self.min_runs, self.seed = window_days, min_runs, seed
        self.events = events
        self.calibration: Calibration | None = None     # None: not fitted yet

    async def refit(self) -> Calibration:
        """Fit the store's measurements now and plan with the result from here on."""
        from planner.service.calibration_data import calibrate, calibration_data

        data = await self.in_store(calibration_data, self.store, window_days=self.window_days)
        cal = fitted_only(await asyncio.to_thread(calibrate, data, min_runs=self.min_runs,
                                                  seed=self.seed))
        if self.calibration is None or planned_with(self.calibration) != planned_with(cal):
            log.info("calibration: %s (from %s, %s with throughput tests)", describe(cal),
                     count(len(data.observations), "job run"),
                     count(len(data.bandwidth), "site pair"))
            self.events.calibrated(factors(cal))
        self.calibration = cal
        return cal

    def apply(self, net: Network) -> Network:
        """``net`` with the calibration serve holds (``net`` itself while it changes nothing)."""
        cal = self.calibration
        return net if cal is None or cal.identity else cal.apply(net)


def add_to_runtime(runtime: Any, options: ServeOptions) -> ServeCalibration | None:
    """Serve's refit on ``runtime`` (a PlannerRuntime) every ``options.calibration_interval_s``,
    the first at start; None when the interval is 0 (serve plans with the reference model)."""
    if options.calibration_interval_s <= 0:
        log.info("calibration: off (--calibration-interval 0); planning with the reference "
                 "cost model")
        return None
    calibration = ServeCalibration(runtime.store, runtime.in_store,
                                   window_days=runtime.window_days, seed=options.seed,
                                   events=getattr(runtime, "events", NO_EVENTS))
    runtime.add_task(BackgroundTask("calibration", calibration.refit,
                                    options.calibration_interval_s, in_store_thread=False,
                                    run_at_start=True))
    log.info("calibration: refitting the cost model to measured step times and throughput "
             "every %.0f s", options.calibration_interval_s)
    return calibration
