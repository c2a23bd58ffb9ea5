"""serve's link model: the fitted predictor of unmeasured site pairs that serve plans with.

Most site pairs of a fleet are never measured; a model fitted on the measured ones
(planner/linkpred, ``chosen_model()``) predicts the rest, and every network serve plans on is
completed with that prediction (``StoreDirectory.network``; docs/COSTMODEL.md section 2).

The pure core decides and compares (values in, values out):

* :func:`refit_reason`: whether the measured set changed enough since the last refit to fit
  again (:class:`RefitRule`): at least ``grown_share`` more measured figures (a pair's RTT or
  throughput each count), a new site, or a pair whose RTT or throughput moved by more than
  ``moved_factor``. Below ``min_throughput_pairs`` measured throughputs there is nothing to fit
  and serve completes links as before (relay and the window formula).
* :func:`refit`: fits the candidate and judges it against the model in use on a seeded held-out
  share of the CURRENT measured figures that the model in use never saw (new pairs, newly
  measured throughputs, figures that moved past ``moved_factor``). The candidate is fitted on the
  rest; the model in use is scored as it is, through the prediction serve plans with. Refitting
  both on the rest would compare two fits of the same data (one algorithm: always a tie) and
  not what serve asks: is the prediction it plans with still as good as a fresh one. Scoring the
  old one only on figures it did not see keeps its memory of measured pairs out of the score.
  The candidate is worse when its p90 |log error| of throughput is higher, or, where throughput
  ties or is missing on both sides, that of RTT; then the old model stays. Otherwise the
  candidate is fitted again on every measured pair and replaces it.

:class:`ServeLinkModel` is the shell: a background task reads the store's measured pairs, asks
the rule, and runs the refit on a worker thread (never on the event loop), one at a time; a
failed refit keeps the model in use and logs one line. Each decision is a log line and
``hulk_link_model_refits_total{outcome}`` (docs/METRICS.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hulk.plural import count as plural
from planner.linkpred.complete import MIN_MEASURED_THROUGHPUTS
from planner.linkpred.graph import (FittedLinkModel, LinkModel, LinkPrediction, SiteGraph,
                                    Source)
from planner.service.metrics import NO_EVENTS, ServeEvents
from planner.service.runtime import BackgroundTask

log = logging.getLogger(__name__)

SWITCHED, KEPT, FAILED = "switched", "kept", "failed"   # hulk_link_model_refits_total outcomes
Pair = tuple[str, str]


@dataclass(frozen=True)
class RefitRule:
    """When serve fits its link model again, and how the candidate is judged."""

    grown_share: float = 0.10       # this share more measured figures than the last refit saw
    moved_factor: float = 2.0       # a measured figure that moved by more than this factor
    # fewer measured throughputs between sites: no model (as `fleet complete` and `plan`)
    min_throughput_pairs: int = MIN_MEASURED_THROUGHPUTS
    holdout_share: float = 0.25     # of the figures the model in use never saw
    min_holdout: int = 3            # fewer such figures: nothing to judge by; the candidate wins


@dataclass(frozen=True)
class FittedLinks:
    """A fitted model, the graph it was fitted on, and its prediction for that graph (what
    completion reads)."""

    model: FittedLinkModel
    graph: SiteGraph
    prediction: LinkPrediction


@dataclass(frozen=True)
class Score:
    """p90 |ln(predicted / measured)| over held-out figures (None: none held out)."""

    throughput: float | None
    rtt: float | None

    def text(self) -> str:
        shown = [f"{name} {value:.3f}" for name, value in (("throughput", self.throughput),
                                                            ("RTT", self.rtt))
                 if value is not None]
        return ", ".join(shown) or "nothing held out"


@dataclass(frozen=True)
class RefitOutcome:
    """What a refit decided: ``switched`` (the candidate is in use) or ``kept`` (the old model
    stays), with the held-out scores (None when there was nothing to compare)."""

    outcome: str
    in_use: FittedLinks
    candidate: Score | None = None
    old: Score | None = None
    held_out: int = 0


def measured_figures(graph: SiteGraph) -> dict[tuple[Pair, str], float]:
    """(site pair in name order, "rtt" | "gbps") -> the measured figure."""
    out: dict[tuple[Pair, str], float] = {}
    for i, j, rtt, gbps in zip(graph.i, graph.j, graph.rtt_ms, graph.gbps):
        a, b = sorted((graph.sites[i], graph.sites[j]))
        if np.isfinite(rtt) and rtt > 0:
            out[((a, b), "rtt")] = float(rtt)
        if np.isfinite(gbps) and gbps > 0:
            out[((a, b), "gbps")] = float(gbps)
    return out


def throughput_pairs(graph: SiteGraph) -> int:
    return int(np.count_nonzero(np.isfinite(graph.gbps) & (graph.gbps > 0)))


def moved(now: float, then: float, factor: float) -> bool:
    """Whether a figure went from ``then`` to ``now`` by more than ``factor`` either way."""
    if not (then > 0 and now > 0):
        return True
    return max(now / then, then / now) > factor


def refit_reason(current: SiteGraph, last: SiteGraph | None,
                 rule: RefitRule = RefitRule()) -> str | None:
    """Why the link model should be fitted again on ``current`` (the measured pairs now), given
    ``last`` (those of the last refit; None: never fitted); None when it should not."""
    have = throughput_pairs(current)
    if have < rule.min_throughput_pairs:
        return None
    if last is None:
        return f"first fit ({plural(have, 'measured throughput')})"
    new_sites = sorted(set(current.sites) - set(last.sites))
    if new_sites:
        return f"new site(s): {', '.join(new_sites[:3])}" + (" ..." if len(new_sites) > 3 else "")
    now, then = measured_figures(current), measured_figures(last)
    grown = len(now.keys() - then.keys())
    if grown and grown >= rule.grown_share * max(len(then), 1):
        return f"{plural(grown, 'new measured figure')} (+{grown / max(len(then), 1):.0%})"
    for key, value in sorted(now.items()):
        if key in then and moved(value, then[key], rule.moved_factor):
            (a, b), what = key
            return (f"{a} - {b} {'throughput' if what == 'gbps' else 'RTT'} moved "
                    f"{max(value / then[key], then[key] / value):.2g}x")
    return None


def unseen(current: SiteGraph, old: LinkPrediction, rule: RefitRule) -> np.ndarray:
    """Per current measured pair and quantity (E x 2: RTT, throughput), True where ``old`` did
    not have that figure as measured (or had it, but it moved past ``rule.moved_factor``), and
    both sites are ones ``old`` knows: what the old prediction can be fairly scored on."""
    index = {site: k for k, site in enumerate(old.sites)}
    out = np.zeros((len(current.i), 2), dtype=bool)
    for e, (i, j) in enumerate(zip(current.i, current.j)):
        a, b = index.get(current.sites[i]), index.get(current.sites[j])
        if a is None or b is None:
            continue
        for q, (value, source, then) in enumerate((
                (current.rtt_ms[e], old.rtt_source, old.rtt_ms),
                (current.gbps[e], old.gbps_source, old.gbps))):
            if not (np.isfinite(value) and value > 0):
                continue
            seen = source[a, b] == Source.MEASURED
            out[e, q] = not seen or moved(float(value), float(then[a, b]), rule.moved_factor)
    return out


def score(prediction: LinkPrediction, current: SiteGraph, which: np.ndarray) -> Score:
    """p90 |log error| of ``prediction``'s point figures on ``current``'s measured pairs
    ``which`` (E x 2 as :func:`unseen`)."""
    index = {site: k for k, site in enumerate(prediction.sites)}
    errors: list[list[float]] = [[], []]
    for e in np.flatnonzero(which.any(axis=1)):
        a = index[current.sites[current.i[e]]]
        b = index[current.sites[current.j[e]]]
        for q, (truth, predicted) in enumerate(((current.rtt_ms, prediction.rtt_ms),
                                                (current.gbps, prediction.gbps))):
            guess = float(predicted[a, b])
            if which[e, q] and np.isfinite(guess) and guess > 0:
                errors[q].append(abs(np.log(guess / float(truth[e]))))
    p90 = [float(np.quantile(err, 0.9)) if err else None for err in errors]
    return Score(throughput=p90[1], rtt=p90[0])


def worse(candidate: Score, old: Score) -> bool:
    """Whether ``candidate`` is worse: higher p90 throughput error, or on a tie (or where either
    has no throughput held out) higher p90 RTT error."""
    for new, was in ((candidate.throughput, old.throughput), (candidate.rtt, old.rtt)):
        if new is None or was is None or np.isclose(new, was, rtol=1e-9, atol=1e-12):
            continue
        return new > was
    return False


def fit(model: LinkModel, graph: SiteGraph, seed: int) -> FittedLinks:
    fitted = model.fit(graph, seed=seed)
    return FittedLinks(fitted, graph, fitted.predict(graph))


def refit(current: SiteGraph, in_use: FittedLinks | None, model: LinkModel, *,
          rule: RefitRule = RefitRule(), seed: int = 0) -> RefitOutcome:
    """Fit ``model`` on ``current`` and keep it unless it is worse than ``in_use`` on a seeded
    held-out share of the current figures ``in_use`` never saw (module docstring)."""
    if in_use is None:
        return RefitOutcome(SWITCHED, fit(model, current, seed))
    fair = unseen(current, in_use.prediction, rule)
    pool = np.flatnonzero(fair.any(axis=1))
    if len(pool) < rule.min_holdout:
        return RefitOutcome(SWITCHED, fit(model, current, seed), held_out=len(pool))
    take = min(len(pool), max(rule.min_holdout, round(rule.holdout_share * len(pool))))
    held = np.zeros(len(current.i), dtype=bool)
    held[np.random.default_rng(seed).choice(pool, size=take, replace=False)] = True
    which = fair & held[:, None]
    rest = current.masked(~held)
    candidate = score(model.fit(rest, seed=seed).predict(rest), current, which)
    old = score(in_use.prediction, current, which)
    if worse(candidate, old):
        return RefitOutcome(KEPT, in_use, candidate, old, take)
    return RefitOutcome(SWITCHED, fit(model, current, seed), candidate, old, take)


def default_model() -> LinkModel:
    """The model completion uses (planner.linkpred.models.chosen_model: the benchmark's pick)."""
    from planner.linkpred.models import chosen_model

    return chosen_model()


class ServeLinkModel:
    """The link model serve plans with. ``read_graph()`` reads the measured site pairs now;
    ``model()`` gives the model to fit (default: the benchmark's pick)."""

    def __init__(self, read_graph: Callable[[], Awaitable[SiteGraph]], *,
                 model: Callable[[], LinkModel] = default_model, rule: RefitRule = RefitRule(),
                 seed: int = 0, events: ServeEvents = NO_EVENTS):
        self.read_graph, self.model, self.rule, self.seed = read_graph, model, rule, seed
        self.events = events
        self.in_use: FittedLinks | None = None
        self.last_graph: SiteGraph | None = None   # the graph the last refit was decided on
        self._refitting = False

    def prediction(self) -> LinkPrediction | None:
        """The prediction completion uses; None before the first fit (the window formula)."""
        in_use = self.in_use
        return None if in_use is None else in_use.prediction

    async def check(self) -> str:
        """Read the measured pairs and, when the rule says so, refit off the event loop; at most
        one refit at a time (a check while one runs returns at once). A line for the log."""
        if self._refitting:
            return "a refit is running"
        self._refitting = True
        try:
            graph = await self.read_graph()
            # A large fleet has tens of thousands of measured pairs: compared off the loop too.
            reason = await asyncio.to_thread(refit_reason, graph, self.last_graph, self.rule)
            if reason is None:
                return "no refit due"
            return await self._refit(graph, reason)
        finally:
            self._refitting = False

    async def _refit(self, graph: SiteGraph, reason: str) -> str:
        old = self.in_use
        was = old.prediction.model if old is not None else "the window formula"
        try:
            model = self.model()
            outcome = await asyncio.to_thread(refit, graph, old, model, rule=self.rule,
                                              seed=self.seed)
        except Exception as exc:  # a failed refit keeps the model in use; serve goes on
            self.last_graph = graph     # tried again at the next change, not at every check
            self.events.link_model_refit(FAILED)
            line = f"link model: refit failed ({type(exc).__name__}: {exc}); keeping {was}"
            log.warning("%s", line)
            return line
        self.last_graph = graph
        self.in_use = outcome.in_use
        name = outcome.in_use.prediction.model
        judged = "" if outcome.candidate is None else (
            f"; held-out p90 |log error| ({plural(outcome.held_out, 'pair')}): "
            f"new {outcome.candidate.text()}, old {outcome.old.text()}")
        if outcome.outcome == KEPT:
            line = f"link model: kept {was}: the refit ({reason}) was worse{judged}"
        else:
            line = f"link model: planning with {name} ({reason}){judged}"
        log.info("%s", line)
        self.events.link_model_refit(outcome.outcome, outcome.candidate, outcome.old)
        return line


def add_to_runtime(runtime: Any, options: Any, *, dashboard_state: Any = None,
                   model: Callable[[], LinkModel] = default_model) -> ServeLinkModel | None:
    """Serve's link model on ``runtime`` (a PlannerRuntime), checked every
    ``options.calibration_interval_s`` (the cost model's refit interval; 0: off, links are
    completed by the window formula), the first check at start; ``dashboard_state`` (a
    DashboardState) shows its prediction; ``model()``: the model to fit."""
    if options.calibration_interval_s <= 0:
        return None
    from planner.linkpred.from_fleet import site_graph
    from planner.service.graph import fleet_from_store

    async def read_graph() -> SiteGraph:
        fleet = await runtime.in_store(fleet_from_store, runtime.store, runtime.window_days,
                                       runtime.fleet)
        return await asyncio.to_thread(site_graph, fleet)

    links = ServeLinkModel(read_graph, model=model, seed=options.seed,
                           events=getattr(runtime, "events", NO_EVENTS))
    runtime.add_task(BackgroundTask("link-model", links.check, options.calibration_interval_s,
                                    in_store_thread=False, run_at_start=True))
    if dashboard_state is not None:
        dashboard_state.links = links.prediction
    log.info("link model: predicting unmeasured site pairs once %s are measured; "
             "checked every %.0f s", plural(RefitRule().min_throughput_pairs, "throughput"),
             options.calibration_interval_s)
    return links
