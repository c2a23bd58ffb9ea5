"""planner.methods: the one registry of methods, read by the CLI, the dashboard, the plots and
serve; what each method is passed."""

from __future__ import annotations

import argparse

import pytest

from planner.core.fleet import Fleet, Link, Node, complete
from planner.core.jobs import catalog_job
from planner.methods import (DEFAULT_METHOD, METHODS, PLAN_OPTIONS, SERVE_BUDGET_S, Method,
                             planner_for, serve_planner)

CALLS: list[dict] = []


def fake_planner(jobs, net, **kwargs):
    """Records what planner_for passes (the Plan is the one a real method would return)."""
    from planner.core.plan import Plan

    CALLS.append(kwargs)
    return Plan("fake", [])


def small_fleet() -> Fleet:
    nodes = tuple(Node(f"n{i}", city=city, gpus=8, gpu_name="NVIDIA A100-SXM4-40GB",
                       compute_capability=8.0, memory_gb=320.0)
                  for i, city in enumerate(["Beijing", "Beijing", "Tokyo"]))
    links = (Link("n0", "n1", rtt_ms=1.0), Link("n0", "n2", rtt_ms=40.0),
             Link("n1", "n2", rtt_ms=41.0))
    return Fleet(nodes, links)


def small_net():
    return complete(small_fleet())


def plan_parser() -> argparse.ArgumentParser:
    from planner.commands import plan as plan_command
    from planner.settings import PlannerSettings

    parser = argparse.ArgumentParser(exit_on_error=False)
    plan_command.register(parser.add_subparsers(), PlannerSettings())
    return parser


def test_the_cli_offers_exactly_the_registrys_methods_and_the_two_cost_models():
    parser = plan_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    method = next(a for a in sub.choices["plan"]._actions if a.dest == "method")
    assert method.choices == list(METHODS) and method.default == DEFAULT_METHOD == "portfolio"
    model = next(a for a in sub.choices["plan"]._actions if a.dest == "cost_model")
    assert model.choices == ("reference", "calibrated") and model.default is None
    with pytest.raises(SystemExit):
        parser.parse_args(["plan", "j.yaml", "--fleet", "f.json", "--cost-model", "measured"])


def test_the_dashboard_compares_the_registrys_methods_under_their_labels():
    import planner.dashboard.compare as compare

    assert not hasattr(compare, "METHODS")
    compared = [name for name, m in METHODS.items() if m.compared]
    assert compare.dashboard_methods(10) == [DEFAULT_METHOD] + compared
    assert "dtfm" in compared and "dtfm" not in compare.dashboard_methods(10**6)
    outcome = compare.run_method("system-b", [catalog_job("gpt2-xl", "a")], small_net(), 0)
    assert outcome.label == METHODS["system-b"].label and outcome.makespan_s > 0


def test_the_dashboards_default_takes_the_baselines_plans_it_made_and_is_never_longer():
    import planner.dashboard.compare as compare

    jobs = [catalog_job("gpt2-xl", "a"), catalog_job("gpt2-xl", "b")]
    result = compare.compare_methods(jobs, small_fleet())
    default, *others = result.methods
    assert default.method == DEFAULT_METHOD and [o.method for o in others] == \
        compare.dashboard_methods(3)[1:]
    made = [o.makespan_s for o in others if o.makespan_s is not None]
    assert made and default.makespan_s <= min(made)


@pytest.mark.process   # matplotlib may run fc-list to build its font cache
def test_the_plot_labels_its_bars_as_the_registry_does(tmp_path):
    from planner.core.evaluate import evaluate
    from planner.plots.plan import plot_reports

    net, jobs = small_net(), [catalog_job("gpt2-xl", "a")]
    reports = {m: evaluate(planner_for(m)(jobs, net), net) for m in ("system-a", "system-b")}
    labels = plot_reports(reports, tmp_path / "plot.png")
    assert labels == [METHODS["system-a"].label, METHODS["system-b"].label]
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_labels_are_unique_and_only_the_search_methods_plan_several_views():
    assert len({m.label for m in METHODS.values()}) == len(METHODS)
    assert all(name == m.name for name, m in METHODS.items())
    # gnn is the portfolio with one more start, so it plans and takes options as the portfolio
    assert {name for name, m in METHODS.items() if m.views} == {"portfolio", "search", "gnn"}
    assert {name for name, m in METHODS.items() if m.options} == {"portfolio", "gnn"}
    assert not METHODS["search"].seeded   # the search is deterministic: it takes no seed


@pytest.fixture
def fake_methods(monkeypatch):
    CALLS.clear()
    monkeypatch.setitem(METHODS, "fake", Method("fake", "Fake", __name__, "fake_planner",
                                                fixed={"refine": False},
                                                options=frozenset({"budget_s"})))
    monkeypatch.setitem(METHODS, DEFAULT_METHOD, Method(DEFAULT_METHOD, "Fake default", __name__,
                                                        "fake_planner", seeded=True,
                                                        options=PLAN_OPTIONS))
    return CALLS


def test_planner_for_passes_only_what_a_method_takes(fake_methods):
    net = small_net()
    planner_for("fake")([], net, seed=7, budget_s=3.0, workers=1, starts=None)
    planner_for(DEFAULT_METHOD)([], net, seed=7, budget_s=None, workers=2, starts=4)
    assert fake_methods[0] == {"refine": False, "budget_s": 3.0, "progress": None}
    assert fake_methods[1] == {"seed": 7, "workers": 2, "starts": 4, "progress": None}


def test_serve_planner_is_the_default_method_in_process_with_serves_budget(fake_methods,
                                                                           monkeypatch):
    # The GNN's real scores and a damaged checkpoint: tests/planner/gnn/test_online.py.
    import planner.methods

    net = small_net()
    serve_planner()([], net, seed=3)
    assert fake_methods[-1] == {"seed": 3, "budget_s": SERVE_BUDGET_S, "workers": 1,
                                "progress": None}
    scored = []
    monkeypatch.setattr(planner.methods, "gnn_starts",
                        lambda jobs, net, path: scored.append(path) or [("gnn", "scores")])
    plan = serve_planner(budget_s=5.0, checkpoint="model.pt")([], net)
    assert plan.method == "fake" and [str(p) for p in scored] == ["model.pt"]
    assert fake_methods[-1] == {"seed": 0, "budget_s": 5.0, "workers": 1, "progress": None,
                                "extra_starts": [("gnn", "scores")]}
