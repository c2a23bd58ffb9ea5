"""serve's link model: when it refits, how a refit is judged against the model in use, one refit
at a time, a failed refit changes nothing; and the network serve plans on is completed with the
prediction in use."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading

import numpy as np
import pytest

from planner.core.fleet import GBIT, Fleet, Link, Node, bandwidth_from_rtt
from planner.linkpred.graph import Source
from planner.service.link_model import (FAILED, KEPT, SWITCHED, RefitRule, Score,
                                        ServeLinkModel, add_to_runtime, fit, refit,
                                        refit_reason, unseen, worse)
from planner.service.metrics import PlannerMetrics
from planner.service.runtime import BackgroundTask
from planner.service.seams import ServeOptions, StoreDirectory
from planner.service.store import Store
from tests.helpers.link_predictions import FixedLinkModel, link_prediction, site_graph_of

SITES = tuple(f"s{k}" for k in range(8))
ALL_PAIRS = list(itertools.combinations(SITES, 2))          # 28
TRUE_GBPS, TRUE_RTT = 2.0, 40.0


def measured(pairs, gbps: float = TRUE_GBPS, rtt: float = TRUE_RTT):
    return site_graph_of(SITES, {p: (rtt, gbps) for p in pairs})


def sample(metrics: PlannerMetrics, outcome: str) -> float:
    return metrics.registry.get_sample_value("hulk_link_model_refits_total",
                                             {"outcome": outcome})


# ------------------------------------------------------------------------------ the refit rule

def test_the_refit_rule():
    rule = RefitRule()
    base = measured(ALL_PAIRS[:20])
    # Too few measured throughputs to learn from: as `plan` and `fleet complete`, no model.
    assert rule.min_throughput_pairs == 8
    assert refit_reason(measured(ALL_PAIRS[:7]), None, rule) is None
    assert refit_reason(measured(ALL_PAIRS[:8]), None, rule) == \
        "first fit (8 measured throughputs)"
    assert refit_reason(base, None, rule).startswith("first fit (20 measured")
    assert refit_reason(base, base, rule) is None
    # One more pair is 2 figures (RTT, throughput) of the 40 the last refit saw: 5%, under 10%.
    assert refit_reason(measured(ALL_PAIRS[:21]), base, rule) is None
    assert refit_reason(measured(ALL_PAIRS[:22]), base, rule) == \
        "4 new measured figures (+10%)"
    # A throughput measured where only the RTT was: a new figure too.
    rtt_only = site_graph_of(SITES, {p: (TRUE_RTT, np.nan if k < 4 else TRUE_GBPS)
                                     for k, p in enumerate(ALL_PAIRS[:20])})
    assert refit_reason(base, rtt_only, rule) == "4 new measured figures (+11%)"
    # A figure that moved past the factor, not one that moved less.
    moved = site_graph_of(SITES, {p: (TRUE_RTT, TRUE_GBPS * (2.5 if p == ("s0", "s2") else 1.5))
                                  for p in ALL_PAIRS[:20]})
    assert refit_reason(moved, base, rule) == "s0 - s2 throughput moved 2.5x"
    assert refit_reason(measured(ALL_PAIRS[:20], gbps=TRUE_GBPS * 1.9), base, rule) is None
    # A new site.
    fewer = site_graph_of(SITES[:-1], {p: (TRUE_RTT, TRUE_GBPS) for p in ALL_PAIRS[:20]
                                       if "s7" not in p})
    assert refit_reason(base, fewer, rule) == "new site(s): s7"


def test_the_old_model_is_judged_only_on_figures_it_did_not_see():
    old = fit(FixedLinkModel("old", gbps=TRUE_GBPS), measured(ALL_PAIRS[:10]), seed=0)
    # ALL_PAIRS[0]'s throughput moved 3x: the old prediction's figure for it is stale.
    current = site_graph_of(SITES, {p: (TRUE_RTT, TRUE_GBPS * (3 if k == 0 else 1))
                                    for k, p in enumerate(ALL_PAIRS)})
    fair = unseen(current, old.prediction, RefitRule())
    pairs = [(SITES[i], SITES[j]) for i, j in zip(current.i, current.j)]
    seen = {p: fair[k].tolist() for k, p in enumerate(pairs)}
    assert seen[ALL_PAIRS[0]] == [False, True]
    assert all(seen[p] == [False, False] for p in ALL_PAIRS[1:10])
    assert all(seen[p] == [True, True] for p in ALL_PAIRS[10:])


def test_worse_is_throughput_first_then_rtt():
    assert worse(Score(0.5, 0.1), Score(0.4, 0.9))
    assert not worse(Score(0.4, 0.9), Score(0.5, 0.1))
    assert worse(Score(0.4, 0.3), Score(0.4, 0.2))            # a throughput tie: RTT decides
    assert worse(Score(None, 0.3), Score(None, 0.2))
    assert not worse(Score(0.4, 0.2), Score(0.4, 0.2))        # a tie: the fresher fit


# ------------------------------------------------------------------------- keeping the old one

def test_a_worse_candidate_keeps_the_old_model_and_a_better_one_replaces_it():
    current = measured(ALL_PAIRS)
    good = fit(FixedLinkModel("good", gbps=TRUE_GBPS), measured(ALL_PAIRS[:10]), seed=0)
    bad_model = FixedLinkModel("bad", gbps=10 * TRUE_GBPS)
    kept = refit(current, good, bad_model, seed=3)
    assert kept.outcome == KEPT and kept.in_use is good and bad_model.fits == 1
    assert kept.held_out == 4          # a quarter of the 18 pairs the old one never saw
    assert kept.candidate.throughput == pytest.approx(np.log(10))
    assert kept.old.throughput == pytest.approx(0.0)

    bad = fit(FixedLinkModel("bad", gbps=10 * TRUE_GBPS), measured(ALL_PAIRS[:10]), seed=0)
    good_model = FixedLinkModel("good", gbps=TRUE_GBPS)
    switched = refit(current, bad, good_model, seed=3)
    assert switched.outcome == SWITCHED and switched.in_use.prediction.model == "good"
    # Judged on the held-out pairs, then fitted again on every measured pair.
    assert good_model.fits == 2 and switched.in_use.graph is current
    assert switched.candidate.throughput < switched.old.throughput


def test_the_first_fit_and_a_refit_with_nothing_unseen_take_the_candidate():
    current = measured(ALL_PAIRS[:10])
    first = refit(current, None, FixedLinkModel("a", gbps=5.0))
    assert first.outcome == SWITCHED and first.candidate is None
    # Every figure now was measured when "a" was fitted: nothing to judge by.
    second = refit(current, first.in_use, FixedLinkModel("b", gbps=50.0))
    assert second.outcome == SWITCHED and second.held_out == 0
    assert second.in_use.prediction.model == "b"


# ------------------------------------------------------------------------------ serve's shell

class Graphs:
    """What serve's store would read: the measured pairs, changed by the test."""

    def __init__(self, graph):
        self.graph = graph

    async def __call__(self):
        return self.graph


async def test_serve_logs_and_counts_each_decision_and_keeps_the_old_model(caplog):
    caplog.set_level(logging.INFO, logger="planner.service.link_model")
    metrics = PlannerMetrics()
    graphs = Graphs(measured(ALL_PAIRS[:2]))
    models = iter([FixedLinkModel("good", gbps=TRUE_GBPS),
                   FixedLinkModel("bad", gbps=10 * TRUE_GBPS)])
    links = ServeLinkModel(graphs, model=lambda: next(models), events=metrics)
    assert await links.check() == "no refit due" and links.prediction() is None
    graphs.graph = measured(ALL_PAIRS[:10])
    await links.check()
    assert links.prediction().model == "good"
    graphs.graph = measured(ALL_PAIRS)
    line = await links.check()
    assert line.startswith("link model: kept good: the refit (36 new measured figures (+180%))"
                           " was worse; held-out p90 |log error| (4 pairs): new throughput")
    assert links.prediction().model == "good"
    # The set it was tried on is the new baseline: no refit again until it changes again.
    assert await links.check() == "no refit due"
    assert [r.getMessage() for r in caplog.records][-1] == line
    assert (sample(metrics, SWITCHED), sample(metrics, KEPT), sample(metrics, FAILED)) == (1, 1, 0)
    error = metrics.registry.get_sample_value
    assert error("hulk_link_model_heldout_error", {"model": "new", "quantity": "throughput"}) \
        == pytest.approx(np.log(10))
    assert error("hulk_link_model_heldout_error", {"model": "old", "quantity": "throughput"}) \
        == pytest.approx(0.0)


async def test_a_failed_refit_keeps_the_model_in_use_and_logs_one_line(caplog):
    caplog.set_level(logging.INFO, logger="planner.service.link_model")
    metrics = PlannerMetrics()
    graphs = Graphs(measured(ALL_PAIRS[:10]))
    models = iter([FixedLinkModel("good", gbps=TRUE_GBPS),
                   FixedLinkModel("broken", gbps=TRUE_GBPS, fail=True)])
    links = ServeLinkModel(graphs, model=lambda: next(models), events=metrics)
    await links.check()
    in_use = links.in_use
    caplog.clear()
    graphs.graph = measured(ALL_PAIRS)
    line = await links.check()
    assert links.in_use is in_use and links.prediction().model == "good"
    assert line == ("link model: refit failed (RuntimeError: the fit diverged); keeping good")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", line)]
    assert sample(metrics, FAILED) == 1


class GatedModel(FixedLinkModel):
    """Its fit waits for ``release``: a refit that is still running."""

    def __init__(self):
        super().__init__("gated", gbps=TRUE_GBPS)
        self.entered, self.release = threading.Event(), threading.Event()

    def fit(self, graph, seed=0):
        self.entered.set()
        assert self.release.wait(30), "the test never released the fit"
        return super().fit(graph, seed)


async def test_one_refit_at_a_time_and_never_on_the_event_loop():
    model = GatedModel()
    links = ServeLinkModel(Graphs(measured(ALL_PAIRS)), model=lambda: model)
    first = asyncio.create_task(links.check())
    # The fit blocks its thread; the event loop goes on (this await returns) while it does.
    assert await asyncio.to_thread(model.entered.wait, 30)
    assert await links.check() == "a refit is running"
    model.release.set()
    assert (await first).startswith("link model: planning with gated")
    assert model.fits == 1


class Runtime:
    """What add_to_runtime needs of serve's PlannerRuntime."""

    store, window_days, fleet, in_store = None, 90, "default", None

    def __init__(self):
        self.tasks: list[BackgroundTask] = []

    def add_task(self, task):
        self.tasks.append(task)


class Dashboard:
    """What add_to_runtime needs of the dashboard's DashboardState."""

    links = None


def test_the_task_runs_at_the_calibration_interval_and_feeds_the_dashboard():
    runtime = Runtime()
    assert add_to_runtime(runtime, ServeOptions(calibration_interval_s=0)) is None
    dashboard = Dashboard()
    links = add_to_runtime(runtime, ServeOptions(calibration_interval_s=30),
                           dashboard_state=dashboard)
    [task] = runtime.tasks
    assert (task.name, task.interval_s, task.run_at_start, task.in_store_thread) == \
        ("link-model", 30, True, False)
    assert dashboard.links == links.prediction


def test_serve_runs_the_link_model_when_it_plans_or_shows_the_dashboard():
    from planner.cli import build_parser
    from planner.commands.serve import add_link_model
    from planner.settings import PlannerSettings

    def parsed(*flags):
        return build_parser(PlannerSettings(), "serve").parse_args(
            ["serve", "--db", "x.sqlite", "--insecure", *flags])

    assert add_link_model(Runtime(), parsed(), None) is None
    runtime = Runtime()
    assert add_link_model(runtime, parsed("--mqtt", "mqtt://127.0.0.1:1883"), None) is not None
    assert [t.name for t in runtime.tasks] == ["link-model"]
    dashboard = type("D", (), {"state": Dashboard()})()
    links = add_link_model(Runtime(), parsed(), dashboard)
    assert dashboard.state.links == links.prediction
    off = parsed("--mqtt", "mqtt://127.0.0.1:1883", "--calibration-interval", "0")
    assert add_link_model(Runtime(), off, dashboard) is None


# ------------------------------------------------------------------------------ serve's network

async def here(fn, *args, **kwargs):      # the store's thread, in a test: this one
    return fn(*args, **kwargs)


async def test_the_network_serve_plans_on_takes_the_prediction_for_unmeasured_pairs(tmp_path):
    nodes = tuple(Node(f"{s}-1", gpus=1, memory_gb=40.0, site=f"site-{s}") for s in "abc")
    links = (Link("a-1", "b-1", rtt_ms=10.0, samples=5), Link("a-1", "c-1", rtt_ms=20.0, samples=5))
    predicted = link_prediction(("site-a", "site-b", "site-c"), {
        ("site-b", "site-c"): (25.0, 35.0, 5.0, 4.0, Source.PREDICTED)})
    holder = {"prediction": None}
    with Store(tmp_path / "s.sqlite") as store:
        store.import_fleet(Fleet(nodes, links))
        directory = StoreDirectory(store, here, fleet="default", window_days=90,
                                   links=lambda: holder["prediction"])
        formula = await directory.network()
        holder["prediction"] = predicted
        planning = await directory.network()
    b, c = formula.index["b-1"], formula.index["c-1"]
    # Without a prediction: relay over the measured RTTs and the window formula, as before.
    assert formula.rtt_ms[b, c] == pytest.approx(30.0)
    assert formula.bw[b, c] == pytest.approx(bandwidth_from_rtt(30.0))
    # With one: its conservative figures (RTT at the upper bound, throughput at the lower).
    assert planning.rtt_ms[b, c] == pytest.approx(35.0)
    assert planning.bw[b, c] == pytest.approx(4.0 * GBIT)
    a = planning.index["a-1"]
    assert planning.rtt_ms[a, b] == pytest.approx(10.0)         # measured pairs stay measured


async def test_serve_fits_a_real_model_on_the_store_and_plans_with_it(tmp_path):
    from planner.linkpred.models import MODELS

    regions = ("aws:us-east-1", "aws:eu-west-1", "aws:ap-northeast-1", "gcp:us-central1",
               "gcp:europe-west1", "gcp:asia-east1", "azure:eastus", "azure:westeurope")
    nodes = tuple(Node(f"n{k}", gpus=1, memory_gb=40.0, site=r) for k, r in enumerate(regions))
    rng = np.random.default_rng(7)
    measured_pairs = [(a, b) for a, b in itertools.combinations(range(len(nodes)), 2)
                      if rng.random() < 0.6]
    assert len(measured_pairs) >= 8
    links = tuple(Link(nodes[a].id, nodes[b].id, rtt_ms=float(rng.uniform(10, 200)),
                       bandwidth_gbps=float(rng.uniform(0.5, 5.0)), samples=5)
                  for a, b in measured_pairs)
    runtime = Runtime()
    runtime.in_store = here
    with Store(tmp_path / "s.sqlite") as store:
        store.import_fleet(Fleet(nodes, links))
        runtime.store = store
        serve_links = add_to_runtime(runtime, ServeOptions(calibration_interval_s=60),
                                     model=lambda: MODELS["provider median"])
        [task] = runtime.tasks
        assert (await task.run()).startswith("link model: planning with provider median "
                                             "(first fit")
        directory = StoreDirectory(store, here, fleet="default", window_days=90,
                                   links=serve_links.prediction)
        planning = await directory.network()
        formula = await StoreDirectory(store, here, fleet="default", window_days=90).network()
    prediction = serve_links.prediction()
    unmeasured = [(a, b) for a, b in itertools.combinations(range(len(nodes)), 2)
                  if (a, b) not in measured_pairs]
    where = {site: k for k, site in enumerate(prediction.sites)}
    changed = 0
    for a, b in unmeasured:
        i, j = where[regions[a]], where[regions[b]]
        x, y = planning.index[f"n{a}"], planning.index[f"n{b}"]
        assert prediction.gbps_source[i, j] == Source.PREDICTED
        assert planning.bw[x, y] == pytest.approx(prediction.gbps_lo[i, j] * GBIT)
        changed += planning.bw[x, y] != pytest.approx(formula.bw[x, y])
    assert changed == len(unmeasured) > 0
