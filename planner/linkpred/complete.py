"""Completion with a link model: the prediction a fleet's links get, and the fleet written back
with a site link for every pair of sites (``hulk-planner fleet complete``; docs/COSTMODEL.md
section 2).

``predict_fleet_links`` fits a model on the fleet's measured site pairs and predicts every
pair. With fewer than ``MIN_MEASURED_THROUGHPUTS`` site pairs of measured throughput there is
nothing to learn a throughput from, and the prediction is today's rule (relay over measured
RTTs, the window formula), all of it marked FORMULA: completing with it plans exactly as
completing without one. ``completed_fleet`` writes a prediction into the fleet as site links.

A site pair with a measured throughput and no measured RTT (ICMP blocked, samples refused) is
a measured site link whose ``rtt_source`` says where its RTT came from: completion's figure for
the pair, never a 0 (``with_formula_rtts``, ``reach_measured_throughputs``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from hulk import geo
from planner.core.fleet import (FORMULA, MEASURED, PREDICTED, Fleet, Network, SiteLink, complete,
                                rtt_from_bandwidth)
from planner.linkpred.graph import LinkModel, LinkPrediction, SiteGraph, Source

# Site pairs with a measured throughput needed before a model predicts throughput: below it
# a model's lower bound would come from its in-sample residuals (controls_base.MIN_FOLD_PAIRS),
# too few to say how wrong it is on pairs it did not see.
MIN_MEASURED_THROUGHPUTS = 8
LINK_CHOICES = ("predicted", "formula")   # `plan --links`


def measured_only(fleet: Fleet) -> Fleet:
    """The fleet without the site links completion wrote (what a model may learn from)."""
    kept = tuple(link for link in fleet.site_links if link.source == MEASURED)
    if len(kept) == len(fleet.site_links):
        return fleet
    return dataclasses.replace(fleet, site_links=kept)


def measured_throughputs(graph) -> int:
    """How many of the graph's measured site pairs have a throughput."""
    return int(np.count_nonzero(graph.gbps > 0))


def predict_fleet_links(fleet: Fleet, model: LinkModel | None = None,
                        seed: int = 0) -> LinkPrediction:
    """Every pair of the fleet's named sites: measured where measured, else ``model``'s
    prediction (None: the benchmark's choice, ``planner.linkpred.models.chosen_model``), or
    today's rule while fewer than ``MIN_MEASURED_THROUGHPUTS`` site pairs measured a
    throughput. Site links a completion wrote are not measurements: left out of the fit."""
    from planner.linkpred.controls import FormulaModel
    from planner.linkpred.from_fleet import site_graph

    graph = site_graph(measured_only(fleet))
    if measured_throughputs(graph) < MIN_MEASURED_THROUGHPUTS:
        model = FormulaModel()
    elif model is None:
        from planner.linkpred.models import chosen_model
        model = chosen_model()
    return reach_measured_throughputs(model.fit(graph, seed).predict(graph), graph)


def reach_measured_throughputs(prediction: LinkPrediction, graph: SiteGraph) -> LinkPrediction:
    """``prediction`` with an RTT for every pair with a measured throughput: where none reaches
    it (no measured path joins the sites), the window formula's RTT of that throughput
    (``rtt_from_bandwidth``), at least light's between the sites, marked FORMULA. A test's
    bytes crossed the link, so it exists and plans may use it."""
    rtt, high = np.asarray(prediction.rtt_ms, dtype=float), np.asarray(prediction.rtt_hi_ms,
                                                                        dtype=float)
    lost = (np.asarray(prediction.gbps_source) == Source.MEASURED) & ~(
        np.isfinite(rtt) & np.isfinite(high))
    np.fill_diagonal(lost, False)
    if not lost.any():
        return prediction
    rtt, high, source = rtt.copy(), high.copy(), np.array(prediction.rtt_source, copy=True)
    places = [None if np.isnan(a) or np.isnan(b) else (float(a), float(b))
              for a, b in zip(graph.latitude, graph.longitude)]
    for a, b in zip(*np.nonzero(lost)):
        estimate = max(rtt_from_bandwidth(float(prediction.gbps[a, b])),
                       geo.min_rtt_ms(places[a], places[b]))
        rtt[a, b] = high[a, b] = estimate
        source[a, b] = Source.FORMULA
    return dataclasses.replace(prediction, rtt_ms=rtt, rtt_hi_ms=high, rtt_source=source)


def with_formula_rtts(fleet: Fleet) -> Fleet:
    """``fleet`` with each measured site link whose RTT the formula fills in (``rtt_source``
    formula: a throughput measured where no RTT was) given completion's RTT for its pair: relay
    over the fleet's measured RTTs, else ``reach_measured_throughputs``'s, as the formula model
    of :func:`predict_fleet_links` gives it."""
    if all(link.rtt_source != FORMULA for link in fleet.site_links):
        return fleet
    from planner.linkpred.controls import FormulaModel
    from planner.linkpred.from_fleet import site_graph

    graph = site_graph(measured_only(fleet))
    prediction = reach_measured_throughputs(FormulaModel().fit(graph).predict(graph), graph)
    where = {name: k for k, name in enumerate(prediction.sites)}
    out = []
    for link in fleet.site_links:
        a, b = where.get(link.src), where.get(link.dst)
        if link.rtt_source == FORMULA and a is not None and b is not None and a != b:
            rtt = float(prediction.rtt_ms[a, b])
            if math.isfinite(rtt):
                link = dataclasses.replace(link, rtt_ms=rtt)
        out.append(link)
    return dataclasses.replace(fleet, site_links=tuple(out))


def network_with_links(fleet: Fleet, links: str = "predicted", seed: int = 0) -> Network:
    """The fleet completed for planning: ``links`` "predicted" completes with
    :func:`predict_fleet_links`, "formula" with today's rule alone."""
    if links not in LINK_CHOICES:
        raise ValueError(f"links: expected one of {', '.join(LINK_CHOICES)}, got {links!r}")
    if links == "formula" or not fleet.nodes:
        return complete(fleet)
    return complete(fleet, prediction=predict_fleet_links(fleet, seed=seed))


def _label(rtt_source: int, gbps_source: int) -> str:
    """A site link's source: measured only when both figures were; predicted when either was."""
    if rtt_source == Source.MEASURED and gbps_source == Source.MEASURED:
        return MEASURED
    if Source.PREDICTED in (rtt_source, gbps_source):
        return PREDICTED
    return FORMULA


def completed_fleet(fleet: Fleet, prediction: LinkPrediction) -> Fleet:
    """``fleet`` with a site link for every pair of two different sites of ``prediction``:
    pairs measured in both figures keep their measured site link (or get one of the rolled-up
    measurements, with their samples and loss); a measured throughput whose RTT was not stays
    a measured link, its RTT's source in ``rtt_source`` and its bound in ``rtt_hi_ms``; the
    others carry their source, the point figures as ``rtt_ms`` / ``bandwidth_gbps`` and the
    conservative ones as ``rtt_hi_ms`` / ``bandwidth_lo_gbps``. A measured figure stays the
    point and the bound. Pairs no RTT reaches (two components with nothing predicted between
    them) get no link. Nodes, node links, sites and site links of a site with itself are kept
    as they are."""
    names = prediction.sites
    index = {name: k for k, name in enumerate(names)}
    given: dict[tuple[int, int], SiteLink] = {}
    kept: list[SiteLink] = []
    for link in measured_only(fleet).site_links:
        a, b = index.get(link.src), index.get(link.dst)
        if a is None or b is None or a == b:
            kept.append(link)
        else:
            given.setdefault((min(a, b), max(a, b)), link)
    counted = _measured_counts(fleet, index)
    ii, jj = np.triu_indices(len(names), k=1)
    columns = [np.asarray(m)[ii, jj].tolist() for m in (
        prediction.rtt_source, prediction.gbps_source, prediction.rtt_ms, prediction.rtt_hi_ms,
        prediction.gbps, prediction.gbps_lo)]
    out = []
    for a, b, rtt_source, gbps_source, point, high, bw, low in zip(
            ii.tolist(), jj.tolist(), *columns):
        source = _label(rtt_source, gbps_source)
        if source == MEASURED and (a, b) in given:
            out.append(given[(a, b)])
            continue
        if not (math.isfinite(point) and math.isfinite(high)):
            continue
        has_bw = math.isfinite(bw) and bw > 0 and math.isfinite(low) and low > 0
        samples, loss = counted.get((a, b), (0, 0.0))
        if source == MEASURED:
            out.append(SiteLink(names[a], names[b], rtt_ms=point,
                                bandwidth_gbps=bw if has_bw else None, loss=loss,
                                samples=samples))
            continue
        if gbps_source == Source.MEASURED and has_bw:
            # The measured throughput is planned as measured; only its RTT was completed.
            out.append(SiteLink(names[a], names[b], rtt_ms=point, bandwidth_gbps=bw, loss=loss,
                                samples=samples, rtt_source=Source(rtt_source).label,
                                rtt_hi_ms=max(high, point)))
            continue
        out.append(SiteLink(names[a], names[b], rtt_ms=point,
                            bandwidth_gbps=bw if has_bw else None, source=source,
                            rtt_hi_ms=max(high, point),
                            bandwidth_lo_gbps=min(low, bw) if has_bw else None))
    return dataclasses.replace(fleet, site_links=tuple(kept + out))


def _measured_counts(fleet: Fleet, index: dict[str, int]) -> dict[tuple[int, int], tuple]:
    """(samples, loss) per unordered pair of two different sites: the RTT samples behind the
    fleet's measured links between them (node links and site links, both directions summed),
    and their loss weighted by samples (the plain mean where none gives a count)."""
    from planner.core.sites import roll_up_by_site

    sums: dict[tuple[int, int], list] = {}
    for link in roll_up_by_site(measured_only(fleet)).site_links:
        a, b = index.get(link.src), index.get(link.dst)
        if a is None or b is None or a == b:
            continue
        acc = sums.setdefault((min(a, b), max(a, b)), [0, 0.0, 0.0, 0])
        acc[0] += link.samples
        acc[1] += link.loss * link.samples
        acc[2] += link.loss
        acc[3] += 1
    return {key: (count, lost / count if count else total / links)
            for key, (count, lost, total, links) in sums.items()}


def unreachable_pairs(prediction: LinkPrediction) -> int:
    """Pairs of different sites :func:`completed_fleet` writes no link for: no RTT reaches
    them (its point or its bound is not finite)."""
    ii, jj = np.triu_indices(len(prediction.sites), k=1)
    point = np.asarray(prediction.rtt_ms, dtype=float)[ii, jj]
    high = np.asarray(prediction.rtt_hi_ms, dtype=float)[ii, jj]
    return int(np.count_nonzero(~(np.isfinite(point) & np.isfinite(high))))


def link_counts(prediction: LinkPrediction) -> dict[str, dict[str, int]]:
    """Pairs of different sites by source, per quantity: {"rtt": {"measured": ...}, "gbps": ...}."""
    ii, jj = np.triu_indices(len(prediction.sites), k=1)
    out = {}
    for quantity, sources in (("rtt", prediction.rtt_source), ("gbps", prediction.gbps_source)):
        values = np.bincount(np.asarray(sources)[ii, jj].astype(np.int64), minlength=len(Source))
        out[quantity] = {source.label: int(values[source]) for source in Source}
    return out
