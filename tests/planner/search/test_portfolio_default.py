"""The default plan (planner.search.portfolio without a budget): the same plan whatever the
machine's load or cores, never beaten by a built-in baseline, and valid on small and odd fleets."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from hulk.errors import PlanningError
from planner.commands.plan import check_plannable
from planner.core.evaluate import evaluate
from planner.core.fleet import Fleet, Link, Node, complete
from planner.core.generate import generate_jobs, generate_network
from planner.files.fleet import load_fleet
from planner.files.jobs import load_jobs
from planner.methods import compared_methods, plan_with, planner_for
from planner.search.portfolio import DEFAULT_STARTS, plan_portfolio, refine_starts
from planner.search.scale import SCALE_NODE_LIMIT
from tests.helpers.paths import REPO
from tests.helpers.plan_checks import assert_valid, same_plan
from tests.helpers.processes import run_cli

LAB_TARGET_S = 72 * 60   # the lab's 5-server fleet with examples/jobs.yaml
GENEROUS_S = 600.0       # a budget no start comes near


def span(plan, net) -> float:
    report = evaluate(plan, net)
    assert report.complete, report.unplaced
    return report.makespan_s


def assert_never_beaten(plan, jobs, net, seed: int = 0) -> None:
    """``plan`` is no longer than any built-in baseline's complete plan (same net, same seed)."""
    mine = span(plan, net)
    for method in compared_methods("portfolio", net.n, SCALE_NODE_LIMIT)[0]:
        try:
            other = evaluate(plan_with(method, jobs, net, seed=seed), net)
        except PlanningError:
            continue
        if other.complete:
            assert mine <= other.makespan_s * (1 + 1e-12), (method, mine, other.makespan_s)


@pytest.fixture(scope="module")
def lab5():
    return load_jobs(REPO / "examples" / "jobs.yaml"), complete(
        load_fleet(REPO / "examples" / "fleets" / "lab-5.json"))


def test_the_lab_fleet_file_is_what_make_fleets_writes(tmp_path):
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import make_fleets
    finally:
        sys.path.remove(str(REPO / "examples"))
    from planner.files.fleet import save_fleet_json

    save_fleet_json(make_fleets.make_lab_fleet(), tmp_path / "lab-5.json")
    shipped = REPO / "examples" / "fleets" / "lab-5.json"
    assert (tmp_path / "lab-5.json").read_text() == shipped.read_text()


def test_the_default_plans_the_lab_fleet_within_72_minutes_and_beats_every_baseline(lab5):
    jobs, net = lab5
    plan = plan_portfolio(jobs, net, workers=1)
    assert_valid(plan, net, jobs)
    assert span(plan, net) <= LAB_TARGET_S
    assert_never_beaten(plan, jobs, net)
    assert span(planner_for("portfolio")(jobs, net, workers=1), net) <= span(plan, net)


@pytest.mark.process   # `hulk-planner plan` as a user runs it
def test_plan_on_the_lab_fleet_prints_a_plan_within_72_minutes_and_no_warning():
    result = run_cli("plan", "examples/jobs.yaml", "--fleet", "examples/fleets/lab-5.json",
                     cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    found = re.search(r"^makespan ([0-9.]+) min,", result.stdout, re.MULTILINE)
    assert found, result.stdout
    assert float(found.group(1)) <= 72.0
    assert "baseline plan" in result.stdout
    assert "differ between runs" not in result.stdout
    assert "--time-budget" not in result.stdout


@pytest.mark.process   # worker processes and a busy child process
def test_the_default_is_the_same_plan_on_one_or_two_workers_and_on_a_busy_machine():
    # A fleet where the greedy start beats the heuristic one and ends within its work budget:
    # every start's plan, whether or not a second process ran it and whatever else runs.
    net = generate_network(40, seed=1)
    jobs = generate_jobs(3, seed=1)
    full = refine_starts(jobs, net, budget_s=GENEROUS_S, starts=DEFAULT_STARTS, workers=1)
    assert full.best().name == "greedy-flops" and not full.dropped
    one = plan_portfolio(jobs, net, workers=1)
    two = plan_portfolio(jobs, net, workers=2)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = plan_portfolio(jobs, net)
    finally:
        spinner.kill()
        spinner.wait()
    for plan in (one, two, busy):
        assert same_plan(plan, one) and plan.facts.winner == "greedy-flops"
        assert span(plan, net) == span(one, net) == full.best().makespan_s
        assert not plan.facts.cut_short


@pytest.mark.process   # a worker process
def test_a_start_ended_by_its_work_budget_ends_at_the_same_point_beside_the_heuristic():
    # Here the greedy start asks for more grid evaluations than the heuristic start: run after
    # it (one worker) or beside it (two, waiting where it gets ahead), it stops at one point.
    net = generate_network(30, seed=2)
    jobs = generate_jobs(5, seed=2)
    one = refine_starts(jobs, net, workers=1, baselines=[])
    two = refine_starts(jobs, net, workers=2, baselines=[])
    assert [r.name for r in one.results] == ["heuristic", "greedy-flops"]
    for a, b in zip(one.results, two.results):
        assert same_plan(a.plan, b.plan) and a.makespan_s == b.makespan_s
        assert a.capped == b.capped and not a.cut_short and not b.cut_short
    assert one.results[1].capped and not one.results[0].capped
    plan = plan_portfolio(jobs, net, workers=2, baselines=[])
    assert not plan.facts.cut_short and any("work budget" in n for n in plan.notes)


def test_a_budget_waits_for_the_heuristic_where_it_is_ahead_and_stops_past_its_count():
    from planner.search.portfolio_run import MIN_START_WORK, START_WORK_SHARE, Budget, WorkGrids

    net = generate_network(6, seed=1)
    for used, stops in ((MIN_START_WORK + 900, True), (MIN_START_WORK + 600, False)):
        # the heuristic's count as it goes on: allowing less than the start used, then final
        told = iter([(100.0, False), ((MIN_START_WORK + 500) / START_WORK_SHARE, False),
                     ((MIN_START_WORK + 700) / START_WORK_SHARE, True)])
        grids = WorkGrids(net)
        budget = Budget(grids, lambda: next(told))
        grids.asked += used
        assert budget() is stops and budget.reached is stops
        assert next(told, None) is None   # it asked until the count was final


def test_work_grids_count_the_slots_of_each_grid_asked_for_whether_in_the_table_or_not():
    from planner.search.groups import evaluate_grid
    from planner.search.portfolio_run import WorkGrids

    net = generate_network(8, seed=3)
    job = generate_jobs(1, seed=3, max_params=2e9)[0]
    grids = WorkGrids(net)
    grid = np.arange(4, dtype=np.int64).reshape(2, 2)
    first = evaluate_grid(job, net, grid, 1, True, grids)
    assert grids.asked == 4   # its slots; the evaluations it asks for itself are not counted
    assert evaluate_grid(job, net, grid, 1, True, grids) is first and grids.asked == 8


@pytest.mark.slow
def test_the_default_is_never_beaten_by_a_baseline_on_small_generated_fleets():
    # Fixed seed: 16 fleets of 2-12 servers in 1-4 cities with 1-6 generated jobs; on 3 of
    # them a baseline beats the plain search.
    rng = np.random.default_rng(29)
    planned = 0
    for case in range(16):
        n, cities, n_jobs = (int(rng.integers(2, 13)), int(rng.integers(1, 5)),
                             int(rng.integers(1, 7)))
        net = generate_network(n, seed=case, n_cities=cities)
        jobs = generate_jobs(n_jobs, seed=case, max_params=14e9)
        try:
            check_plannable(jobs, net)
        except PlanningError:
            continue
        plan = plan_portfolio(jobs, net, seed=case, workers=1)
        assert_never_beaten(plan, jobs, net, seed=case)
        planned += 1
    assert planned >= 12   # most of the generated fleets can hold their jobs


def _node(name: str, city: str, memory_gb: float = 320.0, gpus: int = 8) -> Node:
    return Node(id=name, city=city, gpus=gpus, gpu_name="NVIDIA A100-SXM4-40GB",
                compute_capability=8.0, memory_gb=memory_gb)


def _fleet(nodes: list[Node], rtt_ms=None) -> Fleet:
    """``nodes`` with every pair measured at ``rtt_ms(a, b)``; None: no links at all."""
    links = () if rtt_ms is None else tuple(
        Link(a.id, b.id, rtt_ms=rtt_ms(a, b), samples=100)
        for k, a in enumerate(nodes) for b in nodes[k + 1:])
    return Fleet(tuple(nodes), links)


def _by_city(a: Node, b: Node) -> float:
    return 1.0 if a.city == b.city else 40.0


FAR = ["Beijing", "Tokyo", "London", "Paris", "Rome"]
ODD_FLEETS = {   # name: (fleet, number of examples/jobs.yaml's jobs, expected error or None)
    "fewer servers than jobs": (
        _fleet([_node("a", "Beijing"), _node("b", "Tokyo"), _node("c", "Beijing")], _by_city),
        5, None),
    "one city": (_fleet([_node(f"n{i}", "Frankfurt") for i in range(6)], lambda a, b: 0.5),
                 5, None),
    "one city, no links": (_fleet([_node(f"n{i}", "Beijing") for i in range(3)]), 5, None),
    "one server per job": (_fleet([_node(f"n{i}", c) for i, c in enumerate(FAR)],
                                  lambda a, b: 30.0), 5, None),
    "one server": (_fleet([_node("solo", "Beijing")]), 2, None),
    "jobs that cannot all fit at once": (
        _fleet([_node(f"n{i}", c, memory_gb=128.0, gpus=4) for i, c in enumerate(FAR[:2])],
               _by_city), 5, None),
    "cities with no links": (_fleet([_node(f"n{i}", c) for i, c in enumerate(FAR[:4])]), 5,
                             "no two nodes can communicate"),
    "a job larger than the fleet": (_fleet([_node("a", "Beijing", memory_gb=64.0, gpus=2)]), 2,
                                    "GPU memory"),
}


@pytest.mark.parametrize("name", list(ODD_FLEETS))
def test_the_default_plans_odd_fleets_validly_or_says_why_not_in_one_line(name):
    fleet, n_jobs, error = ODD_FLEETS[name]
    jobs = load_jobs(REPO / "examples" / "jobs.yaml")[:n_jobs]
    net = complete(fleet)
    if error is not None:
        with pytest.raises(PlanningError, match=error) as raised:
            check_plannable(jobs, net)
        assert "\n" not in str(raised.value)
        return
    check_plannable(jobs, net)
    plan = planner_for("portfolio")(jobs, net, workers=1)
    if plan.job_s_override:   # tensor parallel (System C) won: no stages to check
        assert not plan.placements and not plan.unplaced
    else:
        assert_valid(plan, net, jobs)
    if name == "jobs that cannot all fit at once":
        assert max(p.phase for p in plan.placements) >= 1   # some jobs wait for a later phase
    assert_never_beaten(plan, jobs, net)
