"""The exact search of small fleets (planner.search.exact): the same optimum as a brute force
over every assignment of servers and every split into phases, bounds no placement beats, never
worse than the search or a baseline, a valid plan and a gap when the budget runs out, and the
default method's note."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from planner.core.costmodel import estimate_plan
from planner.core.evaluate import evaluate
from planner.core.fleet import complete
from planner.core.generate import generate_jobs, generate_network, generate_regional_fleet
from planner.methods import METHODS, plan_with
from planner.search import exact
from planner.search.clusters import network_clusters
from planner.search.groups import solve_group
from planner.search.options import Effort
from planner.search.refine import plan_search
from tests.helpers.brute_force import set_partitions
from tests.helpers.plan_checks import assert_valid

# (servers, jobs, seed); in all but the last, pruning with bounds 1.5 times too high misses
# the optimum, so these instances check that no branch holding it is cut
SMALL = [(5, 3, 1), (5, 3, 7), (4, 2, 8), (5, 3, 11), (5, 3, 25), (4, 2, 2)]


def makespan(placements, net) -> float:
    return estimate_plan(placements, net).makespan_s


def instance(n: int, n_jobs: int, seed: int):
    return generate_jobs(n_jobs, seed=seed, max_params=15e9), generate_network(n, seed=seed)


def brute_force(jobs, net) -> float:
    """Every split of the jobs into phases, and in each phase every assignment of every server
    to one of its jobs or to none, each job on its servers as the per-job solver places it."""
    labels = network_clusters(net)
    times: dict[tuple[int, tuple[int, ...]], float] = {}

    def job_time(j: int, servers: tuple[int, ...]) -> float:
        if not servers:
            return math.inf
        if (j, servers) not in times:
            idx = np.array(servers, dtype=np.int64)
            p, e = solve_group(jobs[j], net, idx, Effort.NORMAL, None, labels[idx])
            times[j, servers] = e.job_s if p is not None else math.inf
        return times[j, servers]

    best = math.inf
    for split in set_partitions(list(range(len(jobs)))):
        total = 0.0
        for block in split:
            phase = math.inf
            for owner in itertools.product(range(len(block) + 1), repeat=net.n):
                phase = min(phase, max(job_time(j, tuple(i for i in range(net.n) if owner[i] == b))
                                       for b, j in enumerate(block)))
            total += phase
        best = min(best, total)
    return best


@pytest.mark.parametrize("n, n_jobs, seed", SMALL)
def test_exact_finds_the_brute_force_optimum(n, n_jobs, seed):
    jobs, net = instance(n, n_jobs, seed)
    result = exact.solve_exact(jobs, net)
    assert result is not None and result.proved and result.placements is not None
    assert_valid_placements(result.placements, net, jobs)
    assert result.makespan_s == pytest.approx(makespan(result.placements, net), rel=1e-12)
    assert result.makespan_s == pytest.approx(brute_force(jobs, net), rel=1e-9)
    assert result.gap == 0.0


def assert_valid_placements(placements, net, jobs):
    from planner.core.plan import Plan

    assert_valid(Plan("exact", placements), net, jobs)


def test_job_bounds_never_exceed_a_placement():
    rng = np.random.default_rng(7)
    for seed in range(8):
        jobs = generate_jobs(2, seed=100 + seed, max_params=15e9 if seed % 2 else 70e9)
        net = generate_network(9 + seed % 4, seed=100 + seed) if seed % 3 else \
            complete(generate_regional_fleet(12, 3, seed=100 + seed))
        inst = exact._Instance(jobs, net)
        labels = network_clusters(net)
        for job in jobs:
            bounds = exact.job_bounds(job, inst)
            for x in [inst.counts] + [rng.integers(0, inst.counts + 1) for _ in range(8)]:
                if x.sum() == 0:
                    continue
                nodes = np.concatenate([cl[:k] for cl, k in zip(inst.classes, x)])
                p, e = solve_group(job, net, nodes, Effort.NORMAL, None, labels[nodes])
                bound = bounds[inst.index(x)]
                if p is None:
                    continue
                assert bound <= e.job_s * (1 + 1e-9), (seed, job.name, x)


BASELINES = [m for m in METHODS if METHODS[m].compared]


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_never_worse_than_the_search_or_a_baseline(seed):
    jobs, net = instance(4 + seed % 4, 1 + seed % 3, 40 + seed)
    searched = plan_search(jobs, net)
    improved = exact.improve(jobs, net, searched)
    assert_valid(improved, net, jobs)
    mine = evaluate(improved, net).makespan_s
    assert mine <= evaluate(searched, net).makespan_s * (1 + 1e-9)
    assert any(n.startswith(exact.NOTE_PREFIX) for n in improved.notes)
    for method in BASELINES:
        other = plan_with(method, jobs, net)
        if other.unplaced:
            continue
        assert mine <= evaluate(other, net).makespan_s * (1 + 1e-9), method


def test_budget_exhaustion_gives_a_valid_plan_and_a_gap():
    jobs, net = instance(12, 3, 9)
    searched = plan_search(jobs, net)
    result = exact.solve_exact(jobs, net, incumbent_s=makespan(searched.placements, net),
                               evaluations=5)
    assert result is not None and not result.proved
    assert result.evaluations <= 5
    assert 0 < result.bound_s <= result.makespan_s and 0 < result.gap < math.inf
    plan = exact.improve(jobs, net, searched, evaluations=5)
    assert_valid(plan, net, jobs)
    assert plan.notes[-1].startswith(f"{exact.NOTE_PREFIX} within ")


def test_the_default_method_carries_the_verdict_on_a_small_fleet_only():
    jobs, net = instance(5, 2, 5)
    plan = plan_with("portfolio", jobs, net, workers=1)
    verdicts = [n for n in plan.notes if n.startswith(exact.NOTE_PREFIX)]
    assert len(verdicts) == 1 and verdicts[0].startswith(
        f"{exact.NOTE_PREFIX} optimal under the cost model (")
    again = exact.solve_exact(jobs, net, incumbent_s=evaluate(plan, net).makespan_s)
    assert again.proved and again.placements is None   # nothing shorter than the default
    assert exact.applies(jobs, net)
    assert not exact.applies(jobs, generate_network(exact.MAX_SERVERS + 1, seed=5))


def test_plan_prints_the_verdict_once():
    from rich.console import Console

    from planner.commands.plan import print_optimality
    from planner.core.plan import Plan

    console = Console(record=True, width=300)
    plan = Plan("portfolio", [], notes=["portfolio: best of 8", f"{exact.NOTE_PREFIX} within 5.0% "
                                        "of the optimum under the cost model (...)"])
    print_optimality(console, plan)
    print_optimality(console, Plan("portfolio", [], notes=["portfolio: best of 8"]))
    assert console.export_text() == "optimality: within 5.0% of the optimum under the cost " \
                                    "model (...)\n"


def test_fewer_servers_than_jobs_gets_a_shorter_plan_in_phases_and_says_so():
    jobs = generate_jobs(5, seed=4, max_params=2e9)
    net = generate_network(3, seed=4)
    searched = plan_search(jobs, net)
    improved = exact.improve(jobs, net, searched)
    assert_valid(improved, net, jobs)
    before, after = makespan(searched.placements, net), makespan(improved.placements, net)
    assert after < before * (1 - 1e-6)
    assert len({p.phase for p in improved.placements}) > 1   # 5 jobs cannot share 3 servers
    assert improved.facts.winner == "exact"
    assert improved.notes[-1].startswith(f"{exact.NOTE_PREFIX} optimal under the cost model")
    assert (f"its own plan, {1 - after / before:.1%} shorter than the default's"
            in improved.notes[-1])


def test_jobs_fit_together_exactly_where_disjoint_shares_under_the_threshold_exist():
    """suffix_fits against every split of each vector into one share per job (seeded)."""
    from planner.search.exact_bounds import suffix_fits

    rng = np.random.default_rng(3)
    for shape in [(2, 3), (3, 2, 2), (2, 2, 2, 2)]:
        vectors = [np.array(v) for v in itertools.product(*(range(s) for s in shape))]
        flat = {tuple(v): i for i, v in enumerate(vectors)}
        for _ in range(4):
            bounds = [rng.uniform(0, 10, len(vectors)) for _ in range(3)]
            fits = suffix_fits(bounds, 6.0, shape)
            assert fits[-1].all()
            for depth in range(3):
                for r in vectors:
                    below = [v for v in vectors if (v <= r).all()]
                    want = any((sum(split) <= r).all()
                               and all(bounds[depth + i][flat[tuple(y)]] < 6.0
                                       for i, y in enumerate(split))
                               for split in itertools.product(below, repeat=3 - depth))
                    assert fits[depth][flat[tuple(r)]] == want, (shape, depth, r)


def test_the_pipeline_bound_counts_the_first_micro_batch_and_the_slowest_stage():
    """One job pipelined across two sites (12 servers): the bound on the whole fleet stays
    below the solver's placement and at most 12% under it (without the first micro-batch's
    compute and the slowest stage it sat 19% under)."""
    jobs, net = generate_jobs(1, seed=25, max_params=15e9), generate_network(12, seed=25)
    inst = exact._Instance(jobs, net)
    bound = exact.job_bounds(jobs[0], inst)[-1]
    nodes = np.arange(net.n)
    p, e = solve_group(jobs[0], net, nodes, Effort.NORMAL, None, network_clusters(net))
    assert p is not None and 0.88 * e.job_s <= bound <= e.job_s * (1 + 1e-9)


def test_jobs_left_that_cannot_share_the_servers_left_are_cut(monkeypatch):
    """Five jobs on 8 servers: the same proved optimum as with each job's bound alone, in
    fewer solver calls."""
    jobs, net = generate_jobs(5, seed=19, max_params=15e9), generate_network(8, seed=19)
    joint = exact.solve_exact(jobs, net)
    monkeypatch.setattr(exact, "suffix_fits", lambda bounds, threshold, shape: [
        np.ones(int(np.prod(shape)), dtype=bool)] * (len(bounds) + 1))
    alone = exact.solve_exact(jobs, net)
    assert joint.proved and alone.proved
    assert joint.makespan_s == pytest.approx(alone.makespan_s, rel=1e-9)
    assert joint.evaluations < alone.evaluations
